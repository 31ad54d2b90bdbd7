// Declarations of the CUDA ops that torch_bindings.cpp registers.
#pragma once

#include <torch/all.h>

torch::Tensor pq2_dequantize(const torch::Tensor& raw, c10::ScalarType dtype);
