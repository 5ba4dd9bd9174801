// PIPELINE: pad-to-multiple{multiple=128,max-ratio=inf}
// Convolution: input features (3, on input and kernel alike) and output
// features (16) go to 128; spatial dims are untouched.
func.func @main(%x: tensor<2x3x10x10xf32>, %k: tensor<16x3x3x3xf32>) -> tensor<2x16x8x8xf32> {
  %0 = stablehlo.convolution(%x, %k) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[0, 0], [0, 0]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x3x10x10xf32>, tensor<16x3x3x3xf32>) -> tensor<2x16x8x8xf32>
  return %0 : tensor<2x16x8x8xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:[^:]*]]: tensor<2x3x10x10xf32>, %[[K:[^:]*]]: tensor<16x3x3x3xf32>)
// CHECK: %[[PX:.*]] = stablehlo.pad %[[X]], %{{.*}}, low = [0, 0, 0, 0], high = [0, 125, 0, 0]
// CHECK: %[[PK:.*]] = stablehlo.pad %[[K]], %{{.*}}, low = [0, 0, 0, 0], high = [112, 125, 0, 0]
// CHECK: %[[C:.*]] = stablehlo.convolution(%[[PX]], %[[PK]]) {{.*}} -> tensor<2x128x8x8xf32>
// CHECK: %[[S:.*]] = stablehlo.slice %[[C]] [0:2, 0:16, 0:8, 0:8]
// CHECK: return %[[S]]
