// PIPELINE: fuse
// Interleaved regions (from a GPT-2 backward graph, reduced): the matmul
// epilogue {dot, add, multiply} spans the elementwise region {broadcast,
// subtract, tanh}, whose subtract reads the epilogue's add. Outlining the
// epilogue first rewires that subtract; fuse used to lose track of it (it
// keyed ops by a hash that changes when operands change), passed the
// subtract's own result into the elementwise composite and erased it:
// "'stablehlo.composite' op using value defined outside the region", or a
// segfault while re-sorting the block.
func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x16xf32>, %b: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %a = stablehlo.add %d, %b : tensor<8x16xf32>
  %r = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0] : (tensor<8xf32>) -> tensor<8x16xf32>
  %s = stablehlo.subtract %a, %rb : tensor<8x16xf32>
  %t = stablehlo.tanh %s : tensor<8x16xf32>
  %o = stablehlo.multiply %a, %a : tensor<8x16xf32>
  return %t, %o : tensor<8x16xf32>, tensor<8x16xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:[^:]*]]: tensor<8x16xf32>, %[[W:[^:]*]]: tensor<16x16xf32>, %[[B:[^:]*]]: tensor<8x16xf32>)
// CHECK: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<f32>
// CHECK: %[[MM:.*]]:2 = stablehlo.composite "neuron.matmul_epilogue" %[[X]], %[[W]], %[[B]] {decomposition = @[[MMD:neuron.matmul_epilogue_0]]}
// CHECK: %[[R:.*]] = stablehlo.reduce(%[[MM]]#0 init: %[[ZERO]])
// CHECK: %[[EW:.*]] = stablehlo.composite "neuron.elementwise" %[[R]], %[[MM]]#0 {decomposition = @[[EWD:neuron.elementwise_0]]}
// CHECK: return %[[EW]], %[[MM]]#1
// CHECK-DAG: func.func private @[[MMD]]({{.*}}) -> (tensor<8x16xf32>, tensor<8x16xf32>)
// CHECK-DAG: func.func private @[[EWD]](%[[ER:[^:]*]]: tensor<8xf32>, %[[EA:[^:]*]]: tensor<8x16xf32>) -> tensor<8x16xf32>
// CHECK-NEXT: %[[EB:.*]] = stablehlo.broadcast_in_dim %[[ER]]
// CHECK-NEXT: %[[ES:.*]] = stablehlo.subtract %[[EA]], %[[EB]]
// CHECK-NEXT: %[[ET:.*]] = stablehlo.tanh %[[ES]]
// CHECK-NEXT: return %[[ET]]
