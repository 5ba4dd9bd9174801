// PIPELINE: pad-to-multiple{multiple=128,max-ratio=4.0}
// 16x64 @ 64x16 would do 16x the work padded (ratio > max-ratio): untouched.
// 128x100 @ 100x512 pads only its contracting dim (ratio 1.28).
func.func @main(%a: tensor<16x64xf32>, %b: tensor<64x16xf32>, %c: tensor<128x100xf32>, %d: tensor<100x512xf32>) -> (tensor<16x16xf32>, tensor<128x512xf32>) {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<16x64xf32>, tensor<64x16xf32>) -> tensor<16x16xf32>
  %1 = stablehlo.dot_general %c, %d, contracting_dims = [1] x [0] : (tensor<128x100xf32>, tensor<100x512xf32>) -> tensor<128x512xf32>
  return %0, %1 : tensor<16x16xf32>, tensor<128x512xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[A:[^:]*]]: tensor<16x64xf32>, %[[B:[^:]*]]: tensor<64x16xf32>, %[[C:[^:]*]]: tensor<128x100xf32>, %[[D:[^:]*]]: tensor<100x512xf32>)
// CHECK: %[[D0:.*]] = stablehlo.dot_general %[[A]], %[[B]], contracting_dims = [1] x [0] : (tensor<16x64xf32>, tensor<64x16xf32>) -> tensor<16x16xf32>
// CHECK: %[[PC:.*]] = stablehlo.pad %[[C]], {{.*}} -> tensor<128x128xf32>
// CHECK: %[[PD:.*]] = stablehlo.pad %[[D]], {{.*}} -> tensor<128x512xf32>
// CHECK: %[[D1:.*]] = stablehlo.dot_general %[[PC]], %[[PD]], {{.*}} -> tensor<128x512xf32>
// CHECK-NOT: stablehlo.slice
// CHECK: return %[[D0]], %[[D1]]
