// PIPELINE: canonicalize
// The importer's addmm alpha (an arith.constant i64 behind a convert) folds
// away, and an f64 epsilon becomes an f32 splat constant.
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %c1 = arith.constant dense<1> : tensor<1xi64>
  %eps = arith.constant dense<2.5> : tensor<1xf64>
  %0 = stablehlo.convert %c1 : (tensor<1xi64>) -> tensor<1xf32>
  %1 = stablehlo.reshape %0 : (tensor<1xf32>) -> tensor<f32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
  %3 = stablehlo.multiply %x, %2 : tensor<4x8xf32>
  %4 = stablehlo.convert %eps : (tensor<1xf64>) -> tensor<1xf32>
  %5 = stablehlo.reshape %4 : (tensor<1xf32>) -> tensor<f32>
  %6 = stablehlo.broadcast_in_dim %5, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
  %7 = stablehlo.add %3, %6 : tensor<4x8xf32>
  return %7 : tensor<4x8xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:[^:]*]]: tensor<4x8xf32>)
// CHECK-NOT: arith.constant
// CHECK: %[[EPS:.*]] = stablehlo.constant dense<2.500000e+00> : tensor<4x8xf32>
// CHECK-NOT: stablehlo.multiply
// CHECK-NOT: stablehlo.convert
// CHECK: %[[SUM:.*]] = stablehlo.add %[[X]], %[[EPS]] : tensor<4x8xf32>
// CHECK: return %[[SUM]]
