// PIPELINE: pad-to-multiple{multiple=128,max-ratio=inf,free-dims=both}
// A chain of matmuls stays padded: the second dot reads the first one's
// padded result directly, with no slice and re-pad in between.
func.func @main(%x: tensor<8x60xf32>, %w1: tensor<60x100xf32>, %w2: tensor<100x30xf32>) -> tensor<8x30xf32> {
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<8x60xf32>, tensor<60x100xf32>) -> tensor<8x100xf32>
  %1 = stablehlo.dot_general %0, %w2, contracting_dims = [1] x [0] : (tensor<8x100xf32>, tensor<100x30xf32>) -> tensor<8x30xf32>
  return %1 : tensor<8x30xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:[^:]*]]: tensor<8x60xf32>, %[[W1:[^:]*]]: tensor<60x100xf32>, %[[W2:[^:]*]]: tensor<100x30xf32>)
// CHECK: %[[D0:.*]] = stablehlo.dot_general %{{.*}}, %{{.*}} -> tensor<128x128xf32>
// CHECK-NOT: stablehlo.slice %[[D0]]
// CHECK: %[[PW2:.*]] = stablehlo.pad %[[W2]]
// CHECK: %[[D1:.*]] = stablehlo.dot_general %[[D0]], %[[PW2]], contracting_dims = [1] x [0] : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
// CHECK: %[[S:.*]] = stablehlo.slice %[[D1]] [0:8, 0:30]
// CHECK: return %[[S]]
