// Declarations of the CUDA ops that torch_bindings.cpp registers.
#pragma once

#include <optional>

#include <torch/all.h>

torch::Tensor pq2_dequantize(const torch::Tensor& raw, c10::ScalarType dtype);

torch::Tensor pq2_mma_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                           const torch::Tensor& xq, const torch::Tensor& sx,
                           const torch::Tensor& qsum, const std::optional<torch::Tensor>& bias,
                           c10::ScalarType out_dtype, int64_t split_k, bool pdl);

torch::Tensor pq2_gemv_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                            const torch::Tensor& xq, const torch::Tensor& sx,
                            const std::optional<torch::Tensor>& bias, c10::ScalarType out_dtype,
                            bool pdl);

torch::Tensor pq2_mma_small_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                                 const torch::Tensor& xq, const torch::Tensor& sx,
                                 const torch::Tensor& qsum,
                                 const std::optional<torch::Tensor>& bias,
                                 c10::ScalarType out_dtype, bool pdl, int64_t variant);
