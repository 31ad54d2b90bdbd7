// The torch op around the PQ2 activation producer (producer.cu): checks, then the launch on the
// current stream into the caller's tensors (the Q8 activation, and the residual sum and the
// prologue's result where asked for).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"
#include "op_utils.h"
#include "producer.cuh"

namespace {

constexpr const char* kOp = "pq2_produce_int8";

}  // namespace

void pq2_produce_int8(const torch::Tensor& x, const std::optional<torch::Tensor>& residual,
                      const std::optional<torch::Tensor>& rms_weight,
                      const std::optional<torch::Tensor>& gate,
                      const std::optional<torch::Tensor>& signs, torch::Tensor& xq,
                      torch::Tensor& sx, torch::Tensor& qsum,
                      const std::optional<torch::Tensor>& res_out,
                      const std::optional<torch::Tensor>& x_out, int64_t hadamard_block,
                      bool glu, double rms_offset, double eps, int64_t rms_group,
                      bool gate_sigmoid, bool pdl) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 &&
                  (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat16),
              kOp, ": x must be a 2-D bfloat16 or float16 CUDA tensor");
  const int64_t m = x.size(0), k = glu ? x.size(1) / 2 : x.size(1);
  const c10::ScalarType dt = x.scalar_type();
  vllm_prism::check_rows(kOp, "x", x, dt, m, glu ? 2 * k : k, x, false);
  TORCH_CHECK(k > 0 && k % 128 == 0, kOp, ": K = ", k, " must be a positive multiple of 128");
  vllm_prism::check_rows(kOp, "xq", xq, torch::kInt8, m, k, x, true);
  vllm_prism::check_rows(kOp, "sx", sx, torch::kFloat32, m, k / 128, x, true);
  vllm_prism::check_rows(kOp, "qsum", qsum, torch::kInt32, m, k / 128, x, true);
  TORCH_CHECK(residual.has_value() == res_out.has_value(), kOp,
              ": residual and res_out go together");
  if (residual.has_value()) {
    vllm_prism::check_rows(kOp, "residual", *residual, dt, m, k, x, false);
    vllm_prism::check_rows(kOp, "res_out", *res_out, dt, m, k, x, true);
  }
  if (gate.has_value()) vllm_prism::check_rows(kOp, "gate", *gate, dt, m, k, x, false);
  if (x_out.has_value()) vllm_prism::check_rows(kOp, "x_out", *x_out, dt, m, k, x, true);
  TORCH_CHECK(rms_group == 0 || (rms_group >= 32 && rms_group <= 1024 &&
                                 (rms_group & (rms_group - 1)) == 0 && k % rms_group == 0),
              kOp, ": rms_group = ", rms_group, " must be 0 or a power of two in 32..1024 "
              "dividing K = ", k);
  if (rms_weight.has_value()) {
    TORCH_CHECK(rms_weight->device() == x.device() && rms_weight->is_contiguous() &&
                    rms_weight->numel() == (rms_group ? rms_group : k),
                kOp, ": rms_weight must be contiguous with ", rms_group ? rms_group : k,
                " values on x's device");
  }
  if (signs.has_value()) {
    TORCH_CHECK(signs->device() == x.device() && signs->scalar_type() == torch::kFloat32 &&
                    signs->is_contiguous() && signs->numel() == k &&
                    reinterpret_cast<uintptr_t>(signs->data_ptr()) % 16 == 0,
                kOp, ": signs must be contiguous 16-byte aligned float32 with K = ", k,
                " values on x's device");
    TORCH_CHECK(hadamard_block >= 1 && hadamard_block <= 1024 &&
                    (hadamard_block & (hadamard_block - 1)) == 0 && k % hadamard_block == 0,
                kOp, ": hadamard_block = ", hadamard_block,
                " must be a power of two <= 1024 dividing K = ", k);
  }
  if (m == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const vllm_prism::Pq2PrologueParams q = vllm_prism::prologue_params(
      x, residual, res_out, rms_weight, gate, signs, x_out, hadamard_block, glu, rms_offset,
      eps, rms_group, gate_sigmoid);
  vllm_prism::Pq2ProducerOut out{xq.data_ptr<int8_t>(), sx.data_ptr<float>(),
                                 qsum.data_ptr<int32_t>(), xq.stride(0), sx.stride(0)};
  const cudaError_t err = vllm_prism::pq2_produce_int8_launch(
      q, out, static_cast<int>(m), static_cast<int>(k), pdl,
      at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, kOp, ": launch failed: ", cudaGetErrorString(err));
}
