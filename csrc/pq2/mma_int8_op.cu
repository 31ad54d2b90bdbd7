// The torch op around the int8 tensor-core PQ2 kernel for any M (mma_int8.cu): checks,
// output allocation, the K split (its workspace and per-stream tile counters), the launch on
// the current stream.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"
#include "mma_int8.cuh"
#include "op_utils.h"

torch::Tensor pq2_mma_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                           const torch::Tensor& xq, const torch::Tensor& sx,
                           const torch::Tensor& qsum, const std::optional<torch::Tensor>& bias,
                           c10::ScalarType out_dtype, int64_t split_k, bool pdl) {
  vllm_prism::check_weight_planes("pq2_mma_int8", codes, scales);
  vllm_prism::check_int8_activation("pq2_mma_int8", codes, xq, sx, qsum);
  TORCH_CHECK(sx.stride(0) % 2 == 0, "pq2_mma_int8: sx and qsum need an even row stride");
  const int64_t m = xq.size(0), n = codes.size(0), k = codes.size(1) * 16;
  TORCH_CHECK(k % vllm_prism::kPq2MmaBlockK == 0, "pq2_mma_int8: K = ", k,
              " is not a multiple of ", vllm_prism::kPq2MmaBlockK);
  TORCH_CHECK(n < (int64_t{1} << 31) && m < (int64_t{1} << 22), "pq2_mma_int8: too large");
  const c10::cuda::CUDAGuard guard(codes.device());
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  int split = split_k > 0 ? static_cast<int>(split_k)
                          : vllm_prism::pq2_mma_int8_default_split(m, n, k, sms);
  if (vllm_prism::pq2_mma_int8_tiles(m, n) > vllm_prism::kSplitCounters) split = 1;
  torch::Tensor out = torch::empty({m, n}, codes.options().dtype(out_dtype));
  if (m == 0 || n == 0) return out;
  vllm_prism::Pq2LinearParams p{};
  vllm_prism::fill_common(p, codes, scales, xq, sx, bias, out);
  p.qsum = qsum.data_ptr<int32_t>();
  p.split = split;
  p.pdl = pdl;
  torch::Tensor workspace;
  if (split > 1) {
    workspace = torch::empty({vllm_prism::pq2_mma_int8_workspace_floats(m, n, split)},
                             codes.options().dtype(torch::kFloat32));
    p.workspace = workspace.data_ptr<float>();
    p.counters = vllm_prism::split_counters(codes.device());
  }
  const cudaError_t err =
      vllm_prism::pq2_mma_int8_launch(p, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "pq2_mma_int8: launch failed: ", cudaGetErrorString(err));
  return out;
}
