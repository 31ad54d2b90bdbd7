// The torch op around the int8 tensor-core PQ2 kernel (any M) (mma_int8.cu): checks, output
// allocation, the K split, the launch on the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"
#include "mma_int8.cuh"

namespace {

int64_t dtype_code(c10::ScalarType t) {
  if (t == torch::kFloat16) return 1;
  if (t == torch::kBFloat16) return 2;
  TORCH_CHECK(t == torch::kFloat32, "pq2_mma_int8: dtype must be float32, float16 or bfloat16");
  return 0;
}

}  // namespace

torch::Tensor pq2_mma_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                           const torch::Tensor& xq, const torch::Tensor& sx,
                           const torch::Tensor& qsum, const std::optional<torch::Tensor>& bias,
                           c10::ScalarType out_dtype, int64_t split_k, bool pdl) {
  TORCH_CHECK(codes.dtype() == torch::kInt32 && codes.dim() == 2 && codes.stride(1) == 1,
              "pq2_mma_int8: codes must be int32 [N, K/16] with unit column stride");
  TORCH_CHECK(scales.dtype() == torch::kFloat16 && scales.dim() == 2 && scales.stride(1) == 1 &&
                  scales.stride(0) % 2 == 0,
              "pq2_mma_int8: scales must be fp16 [N, G_pad] with an even row stride");
  TORCH_CHECK(xq.dtype() == torch::kInt8 && xq.dim() == 2 && xq.stride(1) == 1 &&
                  xq.stride(0) % 16 == 0,
              "pq2_mma_int8: xq must be int8 [M, K] with 16-byte aligned rows");
  TORCH_CHECK(sx.dtype() == torch::kFloat32 && qsum.dtype() == torch::kInt32 &&
                  sx.stride(1) == 1 && qsum.stride(1) == 1 && sx.stride(0) == qsum.stride(0) &&
                  sx.stride(0) % 2 == 0,
              "pq2_mma_int8: sx (fp32) and qsum (int32) must be [M, G] with one even row stride");
  const int64_t m = xq.size(0), n = codes.size(0), k = codes.size(1) * 16;
  TORCH_CHECK(xq.size(1) == k, "pq2_mma_int8: xq has K = ", xq.size(1), ", codes have ", k);
  TORCH_CHECK(k % vllm_prism::kPq2MmaBlockK == 0, "pq2_mma_int8: K = ", k,
              " is not a multiple of ", vllm_prism::kPq2MmaBlockK);
  TORCH_CHECK(n < (int64_t{1} << 31) && m < (int64_t{1} << 22), "pq2_mma_int8: too large");
  const c10::cuda::CUDAGuard guard(codes.device());
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int split = split_k > 0 ? static_cast<int>(split_k)
                                : vllm_prism::pq2_mma_int8_default_split(m, n, k, sms);
  auto opts = codes.options();
  torch::Tensor out = split > 1 ? torch::zeros({m, n}, opts.dtype(torch::kFloat32))
                                : torch::empty({m, n}, opts.dtype(out_dtype));
  if (m == 0 || n == 0) return out.to(out_dtype);
  vllm_prism::Pq2MmaParams p{};
  p.codes = codes.data_ptr<int32_t>();
  p.scales = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  p.xq = xq.data_ptr<int8_t>();
  p.sx = sx.data_ptr<float>();
  p.qsum = qsum.data_ptr<int32_t>();
  torch::Tensor b;
  if (bias.has_value()) {
    b = bias->contiguous();
    TORCH_CHECK(b.numel() == n, "pq2_mma_int8: bias has ", b.numel(), " values, N = ", n);
    p.bias = b.data_ptr();
    p.bias_dtype = static_cast<int>(dtype_code(b.scalar_type()));
  }
  p.out = out.data_ptr();
  p.out_dtype = static_cast<int>(dtype_code(out.scalar_type()));
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.stride_c = codes.stride(0);
  p.stride_s = scales.stride(0);
  p.stride_x = xq.stride(0);
  p.stride_g = sx.stride(0);
  p.stride_o = out.stride(0);
  p.split = split;
  p.pdl = pdl;
  const cudaError_t err =
      vllm_prism::pq2_mma_int8_launch(p, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "pq2_mma_int8: launch failed: ", cudaGetErrorString(err));
  return split > 1 && out_dtype != torch::kFloat32 ? out.to(out_dtype) : out;
}
