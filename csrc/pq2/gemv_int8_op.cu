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
  vllm_prism::check_int8_rows("pq2_gemv_int8", codes, xq);
  const int64_t m = xq.size(0), n = codes.size(0), k = codes.size(1) * 16;
  TORCH_CHECK(m >= 1 && m <= vllm_prism::kPq2GemvMaxM, "pq2_gemv_int8: M = ", m,
              " outside 1..", vllm_prism::kPq2GemvMaxM);
  TORCH_CHECK(sx.dtype() == torch::kFloat32 && sx.size(0) == m && sx.stride(1) == 1,
              "pq2_gemv_int8: sx must be fp32 [M, G]");
  TORCH_CHECK(k % 64 == 0 && k <= 49152, "pq2_gemv_int8: K = ", k,
              " must be a multiple of 64, at most 49152");
  TORCH_CHECK(m * k <= vllm_prism::kPq2GemvMaxMK, "pq2_gemv_int8: M x K = ", m * k,
              " activation bytes exceed the ", vllm_prism::kPq2GemvMaxMK,
              " its shared memory holds on every sm_80+ GPU");
  const c10::cuda::CUDAGuard guard(codes.device());
  torch::Tensor out = torch::empty({m, n}, codes.options().dtype(out_dtype));
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
