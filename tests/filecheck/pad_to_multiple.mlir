// PIPELINE: pad-to-multiple{multiple=128,max-ratio=inf}
// Contracting dim 60 and lhs free dim 8 go to 128 on both sides alike; the
// rhs free dim (100, the moving side) stays; the result is sliced back.
// %x feeds two matmuls and is padded once.
func.func @main(%x: tensor<8x60xf32>, %w: tensor<60x100xf32>, %v: tensor<60x100xf32>) -> (tensor<8x100xf32>, tensor<8x100xf32>) {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x60xf32>, tensor<60x100xf32>) -> tensor<8x100xf32>
  %1 = stablehlo.dot_general %x, %v, contracting_dims = [1] x [0] : (tensor<8x60xf32>, tensor<60x100xf32>) -> tensor<8x100xf32>
  return %0, %1 : tensor<8x100xf32>, tensor<8x100xf32>
}
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:[^:]*]]: tensor<8x60xf32>, %[[W:[^:]*]]: tensor<60x100xf32>, %[[V:[^:]*]]: tensor<60x100xf32>)
// CHECK: %[[PX:.*]] = stablehlo.pad %[[X]], %{{.*}}, low = [0, 0], high = [120, 68], interior = [0, 0] : (tensor<8x60xf32>, tensor<f32>) -> tensor<128x128xf32>
// CHECK: %[[PW:.*]] = stablehlo.pad %[[W]], %{{.*}}, low = [0, 0], high = [68, 0], interior = [0, 0] : (tensor<60x100xf32>, tensor<f32>) -> tensor<128x100xf32>
// CHECK: %[[D0:.*]] = stablehlo.dot_general %[[PX]], %[[PW]], contracting_dims = [1] x [0] : (tensor<128x128xf32>, tensor<128x100xf32>) -> tensor<128x100xf32>
// CHECK: %[[S0:.*]] = stablehlo.slice %[[D0]] [0:8, 0:100]
// CHECK-NOT: stablehlo.pad %[[X]]
// CHECK: %[[PV:.*]] = stablehlo.pad %[[V]]
// CHECK: %[[D1:.*]] = stablehlo.dot_general %[[PX]], %[[PV]]
// CHECK: %[[S1:.*]] = stablehlo.slice %[[D1]] [0:8, 0:100]
// CHECK: return %[[S0]], %[[S1]]
