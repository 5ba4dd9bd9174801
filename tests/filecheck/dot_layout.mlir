// PIPELINE: dot-layout
// Two weight gradients with more rows than columns: dW1 = x.t() @ dy as the importer
// writes it (a transpose feeding the dot) is swapped into dy.t() @ x and transposed
// back; dW2, contracting dim 0 of both, has its lhs transposed. Every new transpose
// is kept from folding into the dot by a barrier.
func.func @main(%x: tensor<512x2048xf32>, %dy: tensor<512x256xf32>, %h: tensor<512x512xf32>) -> (tensor<2048x256xf32>, tensor<512x256xf32>) {
  %xt = stablehlo.transpose %x, dims = [1, 0] : (tensor<512x2048xf32>) -> tensor<2048x512xf32>
  %0 = stablehlo.dot_general %xt, %dy, contracting_dims = [1] x [0] : (tensor<2048x512xf32>, tensor<512x256xf32>) -> tensor<2048x256xf32>
  %1 = stablehlo.dot_general %h, %dy, contracting_dims = [0] x [0] : (tensor<512x512xf32>, tensor<512x256xf32>) -> tensor<512x256xf32>
  return %0, %1 : tensor<2048x256xf32>, tensor<512x256xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:[^:]*]]: tensor<512x2048xf32>, %[[DY:[^:]*]]: tensor<512x256xf32>, %[[H:[^:]*]]: tensor<512x512xf32>)
// CHECK-NOT: tensor<2048x512xf32>
// CHECK: %[[DYT:.*]] = stablehlo.transpose %[[DY]], dims = [1, 0] : (tensor<512x256xf32>) -> tensor<256x512xf32>
// CHECK: %[[DYTB:.*]] = stablehlo.optimization_barrier %[[DYT]]
// CHECK: %[[P:.*]] = stablehlo.dot_general %[[DYTB]], %[[X]], contracting_dims = [1] x [0] {{.*}} -> tensor<256x2048xf32>
// CHECK: %[[PB:.*]] = stablehlo.optimization_barrier %[[P]]
// CHECK: %[[DW1:.*]] = stablehlo.transpose %[[PB]], dims = [1, 0] : (tensor<256x2048xf32>) -> tensor<2048x256xf32>
// CHECK: %[[HT:.*]] = stablehlo.transpose %[[H]], dims = [1, 0] : (tensor<512x512xf32>) -> tensor<512x512xf32>
// CHECK: %[[HTB:.*]] = stablehlo.optimization_barrier %[[HT]]
// CHECK: %[[DW2:.*]] = stablehlo.dot_general %[[HTB]], %[[DY]], contracting_dims = [1] x [0] {{.*}} -> tensor<512x256xf32>
// CHECK: return %[[DW1]], %[[DW2]]
