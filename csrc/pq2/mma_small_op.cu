// The torch op around the small-batch int8 tensor-core PQ2 kernels (mma_small.cu, and
// mma_bulk.cu as variant 4, mma_lean.cu as variant 6): checks, output, workspace, launch on
// the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"
#include "mma_small.cuh"
#include "op_utils.h"

torch::Tensor pq2_mma_small_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                                 const torch::Tensor& xq, const torch::Tensor& sx,
                                 const torch::Tensor& qsum,
                                 const std::optional<torch::Tensor>& bias,
                                 c10::ScalarType out_dtype, bool pdl, int64_t variant) {
  vllm_prism::check_weight_planes("pq2_mma_small_int8", codes, scales);
  vllm_prism::check_int8_activation("pq2_mma_small_int8", codes, xq, sx, qsum);
  const int64_t m = xq.size(0), n = codes.size(0), k = codes.size(1) * 16;
  TORCH_CHECK(m >= 1 && m <= vllm_prism::kPq2SmallMaxM, "pq2_mma_small_int8: M = ", m,
              " outside 1..", vllm_prism::kPq2SmallMaxM);
  TORCH_CHECK(k % 128 == 0, "pq2_mma_small_int8: K = ", k, " is not a multiple of 128");
  TORCH_CHECK(n < (int64_t{1} << 31), "pq2_mma_small_int8: too many rows");
  TORCH_CHECK(variant >= 0 && variant <= 6, "pq2_mma_small_int8: variant ", variant,
              " (0: loads, then compute; 1: pipelined; 2, 3: streamed into registers; 4: every "
              "multiprocessor's share in flight; 5: streamed by resident CTAs; 6: streamed at "
              "the GEMV's occupancy)");
  TORCH_CHECK(variant != 6 || (m <= vllm_prism::kPq2LeanMaxM && k % 512 == 0 &&
                               reinterpret_cast<uintptr_t>(scales.data_ptr()) % 8 == 0 &&
                               scales.stride(0) % 4 == 0 && xq.stride(0) % 16 == 0),
              "pq2_mma_small_int8: variant 6 takes M <= ", vllm_prism::kPq2LeanMaxM,
              ", K a multiple of 512, scales 8-byte aligned with a row stride that is a "
              "multiple of 4 and xq rows 16-byte aligned; got M = ", m, ", K = ", k);
  TORCH_CHECK(variant < 2 || reinterpret_cast<uintptr_t>(xq.data_ptr()) % 16 == 0,
              "pq2_mma_small_int8: variants 2 to 5 read the activation 16 bytes at a time: xq "
              "needs a 16-byte aligned start");
  TORCH_CHECK(variant != 4 || ((n + 15) / 16 <= vllm_prism::kSplitCounters &&
                                (n + 15) / 16 * (k / 128) * 1024 < (int64_t{1} << 31)),
              "pq2_mma_small_int8: variant 4 takes at most ", vllm_prism::kSplitCounters * 16,
              " rows and 2^21 16x128 tiles (its plan is 32-bit), got N = ", n, ", K = ", k);
  const c10::cuda::CUDAGuard guard(codes.device());
  torch::Tensor out = torch::empty({m, n}, codes.options().dtype(out_dtype));
  if (n == 0) return out;
  vllm_prism::Pq2LinearParams p{};
  vllm_prism::fill_common(p, codes, scales, xq, sx, bias, out);
  p.qsum = qsum.data_ptr<int32_t>();
  p.split = 1;
  p.pdl = pdl;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  torch::Tensor workspace;
  if (variant == 4) {  // the partial sums of the 16-row tiles that CTAs share
    workspace = torch::empty({vllm_prism::pq2_mma_bulk_workspace_floats(
                                 static_cast<int>(n), static_cast<int>(k), sms)},
                             codes.options().dtype(torch::kFloat32));
    p.workspace = workspace.data_ptr<float>();
    p.counters = vllm_prism::split_counters(codes.device());
  }
  const cudaError_t err =
      vllm_prism::pq2_mma_small_launch(p, sms, at::cuda::getCurrentCUDAStream().stream(),
                                       static_cast<int>(variant));
  TORCH_CHECK(err == cudaSuccess, "pq2_mma_small_int8: launch failed: ",
              cudaGetErrorString(err));
  return out;
}
