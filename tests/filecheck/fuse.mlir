// PIPELINE: fuse
// layer norm -> neuron.layer_norm; matmul + bias + relu ->
// neuron.matmul_epilogue; a tanh/multiply chain -> neuron.elementwise.
func.func @main(%x: tensor<8x64xf32>, %g: tensor<64xf32>, %b: tensor<64xf32>, %w: tensor<64x32xf32>, %bias: tensor<32xf32>) -> tensor<8x32xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %n = stablehlo.constant dense<64.0> : tensor<8xf32>
  %eps = stablehlo.constant dense<1.0e-5> : tensor<8xf32>
  %z2 = stablehlo.constant dense<0.0> : tensor<8x32xf32>
  %half = stablehlo.constant dense<0.5> : tensor<8x32xf32>
  %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x64xf32>, tensor<f32>) -> tensor<8xf32>
  %mean = stablehlo.divide %sum, %n : tensor<8xf32>
  %meanb = stablehlo.broadcast_in_dim %mean, dims = [0] : (tensor<8xf32>) -> tensor<8x64xf32>
  %d = stablehlo.subtract %x, %meanb : tensor<8x64xf32>
  %sq = stablehlo.multiply %d, %d : tensor<8x64xf32>
  %vs = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<8x64xf32>, tensor<f32>) -> tensor<8xf32>
  %var = stablehlo.divide %vs, %n : tensor<8xf32>
  %ve = stablehlo.add %var, %eps : tensor<8xf32>
  %r = stablehlo.rsqrt %ve : tensor<8xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0] : (tensor<8xf32>) -> tensor<8x64xf32>
  %xn = stablehlo.multiply %d, %rb : tensor<8x64xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<64xf32>) -> tensor<8x64xf32>
  %xg = stablehlo.multiply %xn, %gb : tensor<8x64xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<64xf32>) -> tensor<8x64xf32>
  %ln = stablehlo.add %xg, %bb : tensor<8x64xf32>
  %mm = stablehlo.dot_general %ln, %w, contracting_dims = [1] x [0] : (tensor<8x64xf32>, tensor<64x32xf32>) -> tensor<8x32xf32>
  %biasb = stablehlo.broadcast_in_dim %bias, dims = [1] : (tensor<32xf32>) -> tensor<8x32xf32>
  %h = stablehlo.add %mm, %biasb : tensor<8x32xf32>
  %act = stablehlo.maximum %h, %z2 : tensor<8x32xf32>
  %red = stablehlo.reduce(%act init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8x32xf32>, tensor<f32>) -> tensor<32xf32>
  %redb = stablehlo.broadcast_in_dim %red, dims = [1] : (tensor<32xf32>) -> tensor<8x32xf32>
  %t = stablehlo.tanh %redb : tensor<8x32xf32>
  %t2 = stablehlo.multiply %t, %half : tensor<8x32xf32>
  %out = stablehlo.add %t2, %act : tensor<8x32xf32>
  return %out : tensor<8x32xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:[^:]*]]: tensor<8x64xf32>, %[[G:[^:]*]]: tensor<64xf32>, %[[B:[^:]*]]: tensor<64xf32>, %[[W:[^:]*]]: tensor<64x32xf32>, %[[BIAS:[^:]*]]: tensor<32xf32>)
// CHECK: %[[LN:.*]] = stablehlo.composite "neuron.layer_norm" %[[X]], %[[G]], %[[B]] {decomposition = @[[LND:neuron.layer_norm_0]]}
// CHECK: %[[MM:.*]] = stablehlo.composite "neuron.matmul_epilogue" %[[LN]], %[[W]], %[[BIAS]] {decomposition = @[[MMD:neuron.matmul_epilogue_0]]}
// CHECK: %[[RED:.*]] = stablehlo.reduce(%[[MM]]
// CHECK: %[[EW:.*]] = stablehlo.composite "neuron.elementwise" %[[RED]], %[[MM]] {decomposition = @[[EWD:neuron.elementwise_0]]}
// CHECK: return %[[EW]]
// CHECK-DAG: func.func private @[[LND]]({{.*}}) -> tensor<8x64xf32>
// CHECK-DAG: func.func private @[[MMD]]({{.*}}) -> tensor<8x32xf32>
// CHECK-DAG: func.func private @[[EWD]]({{.*}}) -> tensor<8x32xf32>
