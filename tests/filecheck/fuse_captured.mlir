// PIPELINE: fuse
// A region op whose own region reads a value from outside it: the RMS norm's
// reduce body adds %k, computed outside the norm. The composite must take %k
// as an input and the outlined reducer must read the block argument; fuse
// used to clone the reducer still pointing at %k in @main ("using value
// defined outside the region").
func.func @main(%x: tensor<4x16xf32>, %w: tensor<16xf32>, %s: tensor<f32>) -> tensor<4x16xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %n = stablehlo.constant dense<16.0> : tensor<4xf32>
  %eps = stablehlo.constant dense<1.0e-5> : tensor<4xf32>
  %k = stablehlo.multiply %s, %s : tensor<f32>
  %sq = stablehlo.multiply %x, %x : tensor<4x16xf32>
  %sum = stablehlo.reduce(%sq init: %zero) across dimensions = [1] : (tensor<4x16xf32>, tensor<f32>) -> tensor<4xf32>
    reducer(%a: tensor<f32>, %b: tensor<f32>) {
      %p = stablehlo.add %a, %b : tensor<f32>
      %q = stablehlo.add %p, %k : tensor<f32>
      stablehlo.return %q : tensor<f32>
    }
  %ms = stablehlo.divide %sum, %n : tensor<4xf32>
  %ve = stablehlo.add %ms, %eps : tensor<4xf32>
  %r = stablehlo.rsqrt %ve : tensor<4xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0] : (tensor<4xf32>) -> tensor<4x16xf32>
  %xn = stablehlo.multiply %x, %rb : tensor<4x16xf32>
  %wb = stablehlo.broadcast_in_dim %w, dims = [1] : (tensor<16xf32>) -> tensor<4x16xf32>
  %y = stablehlo.multiply %xn, %wb : tensor<4x16xf32>
  return %y : tensor<4x16xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:[^:]*]]: tensor<4x16xf32>, %[[W:[^:]*]]: tensor<16xf32>, %[[S:[^:]*]]: tensor<f32>)
// CHECK: %[[K:.*]] = stablehlo.multiply %[[S]], %[[S]] : tensor<f32>
// CHECK: %[[N:.*]] = stablehlo.composite "neuron.rms_norm" %[[X]], %[[K]], %[[W]] {decomposition = @[[ND:neuron.rms_norm_0]]}
// CHECK: return %[[N]]
// CHECK: func.func private @[[ND]](%{{[^:]*}}: tensor<4x16xf32>, %[[KA:[^:]*]]: tensor<f32>, %{{[^:]*}}: tensor<16xf32>)
// CHECK: stablehlo.reduce
// CHECK: %[[P:.*]] = stablehlo.add %{{.*}}, %{{.*}} : tensor<f32>
// CHECK-NEXT: %[[Q:.*]] = stablehlo.add %[[P]], %[[KA]] : tensor<f32>
// CHECK-NEXT: stablehlo.return %[[Q]]
