// The torch op around the PQ2 GEMV for M = 1..4 activation rows (gemv_int8.cu): checks,
// output, launch on the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"
#include "gemv_int8.cuh"
#include "op_utils.h"

torch::Tensor pq2_gemv_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                            const torch::Tensor& xq, const torch::Tensor& sx,
                            const std::optional<torch::Tensor>& bias, c10::ScalarType out_dtype,
                            bool pdl) {
  vllm_prism::check_weight_planes("pq2_gemv_int8", codes, scales);
  TORCH_CHECK(xq.dtype() == torch::kInt8 && xq.dim() == 2 && xq.size(0) >= 1 &&
                  xq.size(0) <= vllm_prism::kPq2GemvMaxM && xq.stride(1) == 1 &&
                  xq.stride(0) % 16 == 0,
              "pq2_gemv_int8: xq must be int8 [M, K] with M = 1..", vllm_prism::kPq2GemvMaxM,
              " and 16-byte aligned rows");
  TORCH_CHECK(sx.dtype() == torch::kFloat32 && sx.size(0) == xq.size(0) && sx.stride(1) == 1,
              "pq2_gemv_int8: sx must be fp32 [M, G]");
  const int64_t n = codes.size(0), k = codes.size(1) * 16;
  TORCH_CHECK(xq.size(1) == k, "pq2_gemv_int8: xq has K = ", xq.size(1), ", codes have ", k);
  TORCH_CHECK(k % 64 == 0 && k <= 49152, "pq2_gemv_int8: K = ", k,
              " must be a multiple of 64, at most 49152");
  const c10::cuda::CUDAGuard guard(codes.device());
  torch::Tensor out = torch::empty({xq.size(0), n}, codes.options().dtype(out_dtype));
  if (n == 0) return out;
  vllm_prism::Pq2LinearParams p{};
  vllm_prism::fill_common(p, codes, scales, xq, sx, bias, out);
  p.split = 1;
  p.pdl = pdl;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaError_t err =
      vllm_prism::pq2_gemv_int8_launch(p, sms, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "pq2_gemv_int8: launch failed: ", cudaGetErrorString(err));
  return out;
}
