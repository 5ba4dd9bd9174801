module {
  func.func @main(%arg0: tensor<8x3x3x3xf32>, %arg1: tensor<4x3x16x16xf32>, %arg2: tensor<8xf32>, %arg3: tensor<8xf32>, %arg4: tensor<8xf32>, %arg5: tensor<4x8x16x16xf32>, %arg6: tensor<4x8x16x16xf32>, %arg7: tensor<4x8x8x8xi64>, %arg8: tensor<4x512xf32>, %arg9: tensor<512x10xf32>, %arg10: tensor<4x10xf32>) -> (tensor<8x3x3x3xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<10x512xf32>, tensor<10xf32>) {
    %c = stablehlo.constant dense<0> : tensor<i64>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<4x8x256xf32>
    %cst_1 = arith.constant dense<1.000000e-05> : tensor<1xf64>
    %0 = stablehlo.transpose %arg9, dims = [1, 0] : (tensor<512x10xf32>) -> tensor<10x512xf32>
    %1 = stablehlo.dot_general %arg10, %0, contracting_dims = [1] x [0] : (tensor<4x10xf32>, tensor<10x512xf32>) -> tensor<4x512xf32>
    %2 = stablehlo.transpose %arg10, dims = [1, 0] : (tensor<4x10xf32>) -> tensor<10x4xf32>
    %3 = stablehlo.dot_general %2, %arg8, contracting_dims = [1] x [0] : (tensor<10x4xf32>, tensor<4x512xf32>) -> tensor<10x512xf32>
    %4 = stablehlo.reduce(%arg10 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<4x10xf32>, tensor<f32>) -> tensor<10xf32>
    %5 = stablehlo.reshape %1 : (tensor<4x512xf32>) -> tensor<4x8x64xf32>
    %6 = stablehlo.iota dim = 0 : tensor<4xi64>
    %7 = stablehlo.broadcast_in_dim %6, dims = [0] : (tensor<4xi64>) -> tensor<4x8x64x1xi64>
    %8 = stablehlo.iota dim = 0 : tensor<8xi64>
    %9 = stablehlo.broadcast_in_dim %8, dims = [1] : (tensor<8xi64>) -> tensor<4x8x64x1xi64>
    %10 = stablehlo.reshape %arg7 : (tensor<4x8x8x8xi64>) -> tensor<4x8x64x1xi64>
    %11 = stablehlo.concatenate %7, %9, %10, dim = 3 : (tensor<4x8x64x1xi64>, tensor<4x8x64x1xi64>, tensor<4x8x64x1xi64>) -> tensor<4x8x64x3xi64>
    %12 = "stablehlo.scatter"(%cst_0, %11, %5) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1, 2], scatter_dims_to_operand_dims = [0, 1, 2], index_vector_dim = 3>, unique_indices = false}> ({
    ^bb0(%arg11: tensor<f32>, %arg12: tensor<f32>):
      %40 = stablehlo.add %arg11, %arg12 : tensor<f32>
      stablehlo.return %40 : tensor<f32>
    }) : (tensor<4x8x256xf32>, tensor<4x8x64x3xi64>, tensor<4x8x64xf32>) -> tensor<4x8x256xf32>
    %13 = stablehlo.convert %c : (tensor<i64>) -> tensor<f32>
    %14 = stablehlo.broadcast_in_dim %13, dims = [] : (tensor<f32>) -> tensor<4x8x16x16xf32>
    %15 = stablehlo.compare LE, %arg6, %14, FLOAT : (tensor<4x8x16x16xf32>, tensor<4x8x16x16xf32>) -> tensor<4x8x16x16xi1>
    %16 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x8x16x16xf32>
    %17 = stablehlo.reshape %12 : (tensor<4x8x256xf32>) -> tensor<4x8x16x16xf32>
    %18 = stablehlo.select %15, %16, %17 : tensor<4x8x16x16xi1>, tensor<4x8x16x16xf32>
    %19 = stablehlo.convert %cst_1 : (tensor<1xf64>) -> tensor<1xf32>
    %20 = stablehlo.reshape %19 : (tensor<1xf32>) -> tensor<f32>
    %21 = stablehlo.broadcast_in_dim %20, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %22 = stablehlo.add %arg3, %21 : tensor<8xf32>
    %23 = stablehlo.rsqrt %22 : tensor<8xf32>
    %24 = stablehlo.reshape %arg2 : (tensor<8xf32>) -> tensor<1x8x1x1xf32>
    %25 = stablehlo.reduce(%18 init: %cst) applies stablehlo.add across dimensions = [0, 2, 3] : (tensor<4x8x16x16xf32>, tensor<f32>) -> tensor<8xf32>
    %26 = stablehlo.broadcast_in_dim %24, dims = [0, 1, 2, 3] : (tensor<1x8x1x1xf32>) -> tensor<4x8x16x16xf32>
    %27 = stablehlo.subtract %arg5, %26 : tensor<4x8x16x16xf32>
    %28 = stablehlo.multiply %18, %27 : tensor<4x8x16x16xf32>
    %29 = stablehlo.reduce(%28 init: %cst) applies stablehlo.add across dimensions = [0, 2, 3] : (tensor<4x8x16x16xf32>, tensor<f32>) -> tensor<8xf32>
    %30 = stablehlo.multiply %23, %arg4 : tensor<8xf32>
    %31 = stablehlo.reshape %30 : (tensor<8xf32>) -> tensor<1x8x1x1xf32>
    %32 = stablehlo.broadcast_in_dim %31, dims = [0, 1, 2, 3] : (tensor<1x8x1x1xf32>) -> tensor<4x8x16x16xf32>
    %33 = stablehlo.multiply %18, %32 : tensor<4x8x16x16xf32>
    %34 = stablehlo.multiply %29, %23 : tensor<8xf32>
    %35 = stablehlo.transpose %arg1, dims = [1, 0, 2, 3] : (tensor<4x3x16x16xf32>) -> tensor<3x4x16x16xf32>
    %36 = stablehlo.transpose %33, dims = [1, 0, 2, 3] : (tensor<4x8x16x16xf32>) -> tensor<8x4x16x16xf32>
    %37 = stablehlo.convolution(%35, %36) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<3x4x16x16xf32>, tensor<8x4x16x16xf32>) -> tensor<3x8x3x3xf32>
    %38 = stablehlo.transpose %37, dims = [1, 0, 2, 3] : (tensor<3x8x3x3xf32>) -> tensor<8x3x3x3xf32>
    %39 = stablehlo.reduce(%33 init: %cst) applies stablehlo.add across dimensions = [0, 2, 3] : (tensor<4x8x16x16xf32>, tensor<f32>) -> tensor<8xf32>
    return %38, %39, %34, %25, %3, %4 : tensor<8x3x3x3xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<10x512xf32>, tensor<10xf32>
  }
}
