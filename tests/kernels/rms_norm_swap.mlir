// The final StableHLO of tests/test_kernels.py::test_composite_swapped_by_name: the fuse pass's
// neuron.rms_norm composite keeps its name and operands, its decomposition is now the registered
// kernel's JAX lowering (a divide by sqrt: the default decomposition multiplies by rsqrt).
// CHECK-LABEL: func.func @main(
// CHECK: stablehlo.composite "neuron.rms_norm" %arg{{[0-9]}}, %arg{{[0-9]}} {decomposition = @kernel.neuron_rms_norm_0.main}
// CHECK-NOT: @neuron.rms_norm_0
// CHECK: func.func private @kernel.neuron_rms_norm_0.main(%arg0: tensor<4x16xf32>, %arg1: tensor<16xf32>) -> tensor<4x16xf32>
// CHECK: stablehlo.sqrt
// CHECK: stablehlo.divide
// CHECK-NOT: stablehlo.rsqrt
// CHECK: return
