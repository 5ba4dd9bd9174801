// PIPELINE: fuse
// scores = Q K^T, scale, causal mask, softmax, times V -> neuron.attention;
// the decomposition holds the original ops, constants cloned in.
func.func @main(%q: tensor<4x16x32xf32>, %k: tensor<4x16x32xf32>, %v: tensor<4x16x32xf32>, %mask: tensor<16x16xf32>) -> tensor<4x16x32xf32> {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %scale = stablehlo.constant dense<0.176776695> : tensor<4x16x16xf32>
  %kt = stablehlo.transpose %k, dims = [0, 2, 1] : (tensor<4x16x32xf32>) -> tensor<4x32x16xf32>
  %s = stablehlo.dot_general %q, %kt, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x16x32xf32>, tensor<4x32x16xf32>) -> tensor<4x16x16xf32>
  %s1 = stablehlo.multiply %s, %scale : tensor<4x16x16xf32>
  %m = stablehlo.broadcast_in_dim %mask, dims = [1, 2] : (tensor<16x16xf32>) -> tensor<4x16x16xf32>
  %s2 = stablehlo.add %s1, %m : tensor<4x16x16xf32>
  %mx = stablehlo.reduce(%s2 init: %ninf) applies stablehlo.maximum across dimensions = [2] : (tensor<4x16x16xf32>, tensor<f32>) -> tensor<4x16xf32>
  %mxb = stablehlo.broadcast_in_dim %mx, dims = [0, 1] : (tensor<4x16xf32>) -> tensor<4x16x16xf32>
  %d = stablehlo.subtract %s2, %mxb : tensor<4x16x16xf32>
  %e = stablehlo.exponential %d : tensor<4x16x16xf32>
  %sum = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [2] : (tensor<4x16x16xf32>, tensor<f32>) -> tensor<4x16xf32>
  %sumb = stablehlo.broadcast_in_dim %sum, dims = [0, 1] : (tensor<4x16xf32>) -> tensor<4x16x16xf32>
  %p = stablehlo.divide %e, %sumb : tensor<4x16x16xf32>
  %o = stablehlo.dot_general %p, %v, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x16x16xf32>, tensor<4x16x32xf32>) -> tensor<4x16x32xf32>
  return %o : tensor<4x16x32xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[Q:[^:]*]]: tensor<4x16x32xf32>, %[[K:[^:]*]]: tensor<4x16x32xf32>, %[[V:[^:]*]]: tensor<4x16x32xf32>, %[[MASK:[^:]*]]: tensor<16x16xf32>)
// CHECK-NEXT: %[[OUT:.*]] = stablehlo.composite "neuron.attention" %[[K]], %[[Q]], %[[MASK]], %[[V]] {decomposition = @[[DEC:neuron.attention_0]]}
// CHECK-NEXT: return %[[OUT]]
// CHECK: func.func private @[[DEC]](%[[DK:[^:]*]]: tensor<4x16x32xf32>, %[[DQ:[^:]*]]: tensor<4x16x32xf32>, %[[DM:[^:]*]]: tensor<16x16xf32>, %[[DV:[^:]*]]: tensor<4x16x32xf32>)
// CHECK: %[[KT:.*]] = stablehlo.transpose %[[DK]]
// CHECK: %[[S:.*]] = stablehlo.dot_general %[[DQ]], %[[KT]]
// CHECK: stablehlo.reduce({{.*}}) applies stablehlo.maximum
// CHECK: stablehlo.exponential
// CHECK: stablehlo.reduce({{.*}}) applies stablehlo.add
// CHECK: %[[P:.*]] = stablehlo.divide
// CHECK: %[[O:.*]] = stablehlo.dot_general %[[P]], %[[DV]]
// CHECK: return %[[O]]
