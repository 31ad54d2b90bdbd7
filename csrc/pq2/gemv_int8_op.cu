// The torch ops around the PQ2 GEMV (gemv_int8.cu): M = 1..4 int8 activation rows, and one
// raw activation row with the producer fused into the launch; checks, output, launch on the
// current stream.
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

torch::Tensor pq2_gemv_fused(const torch::Tensor& codes, const torch::Tensor& scales,
                             const torch::Tensor& x, const std::optional<torch::Tensor>& residual,
                             const std::optional<torch::Tensor>& res_out,
                             const std::optional<torch::Tensor>& rms_weight,
                             const std::optional<torch::Tensor>& gate,
                             const std::optional<torch::Tensor>& signs,
                             const std::optional<torch::Tensor>& bias, int64_t hadamard_block,
                             bool glu, double rms_offset, double eps, int64_t rms_group,
                             bool gate_sigmoid, c10::ScalarType out_dtype, bool pdl) {
  const char* op = "pq2_gemv_fused";
  vllm_prism::check_weight_planes(op, codes, scales);
  const int64_t n = codes.size(0), k = codes.size(1) * 16;
  TORCH_CHECK(x.is_cuda() &&
                  (x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat16),
              op, ": x must be a bfloat16 or float16 CUDA tensor");
  vllm_prism::check_row(op, "x", x, x.scalar_type(), glu ? 2 * k : k, x);
  TORCH_CHECK(k % 128 == 0 && k <= vllm_prism::kPq2GemvFusedMaxK, op, ": K = ", k,
              " must be a multiple of 128, at most ", vllm_prism::kPq2GemvFusedMaxK);
  TORCH_CHECK(residual.has_value() == res_out.has_value(), op,
              ": residual and res_out go together");
  if (residual.has_value()) {
    vllm_prism::check_row(op, "residual", *residual, x.scalar_type(), k, x);
    vllm_prism::check_row(op, "res_out", *res_out, x.scalar_type(), k, x);
  }
  TORCH_CHECK(rms_group == 0 || (rms_group >= 32 && rms_group <= 1024 &&
                                 (rms_group & (rms_group - 1)) == 0 && k % rms_group == 0),
              op, ": rms_group = ", rms_group, " must be 0 or a power of two in 32..1024 "
              "dividing K = ", k);
  if (rms_weight.has_value()) {
    TORCH_CHECK(rms_weight->is_cuda() && rms_weight->is_contiguous() &&
                    rms_weight->numel() == (rms_group ? rms_group : k),
                op, ": rms_weight must be contiguous with ", rms_group ? rms_group : k,
                " values");
  }
  if (gate.has_value()) {
    vllm_prism::check_row(op, "gate", *gate, x.scalar_type(), k, x);
  }
  if (signs.has_value()) {
    TORCH_CHECK(signs->is_cuda() && signs->scalar_type() == torch::kFloat32 &&
                    signs->is_contiguous() && signs->numel() == k &&
                    vllm_prism::aligned16(*signs),
                op, ": signs must be contiguous 16-byte aligned float32 with K = ", k,
                " values");
    TORCH_CHECK(hadamard_block >= 1 && hadamard_block <= 1024 &&
                    (hadamard_block & (hadamard_block - 1)) == 0 && k % hadamard_block == 0,
                op, ": hadamard_block = ", hadamard_block,
                " must be a power of two <= 1024 dividing K = ", k);
  }
  const c10::cuda::CUDAGuard guard(codes.device());
  torch::Tensor out = torch::empty({1, n}, codes.options().dtype(out_dtype));
  if (n == 0) return out;
  vllm_prism::Pq2LinearParams p{};
  p.codes = codes.data_ptr<int32_t>();
  p.scales = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == n, op,
                ": bias must be contiguous with N = ", n, " values");
    p.bias = bias->data_ptr();
    p.bias_dtype = vllm_prism::dtype_code(bias->scalar_type(), "bias");
  }
  p.out = out.data_ptr();
  p.out_dtype = vllm_prism::dtype_code(out_dtype, "out");
  p.m = 1;
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.stride_c = codes.stride(0);
  p.stride_s = scales.stride(0);
  p.stride_o = out.stride(0);
  p.split = 1;
  p.pdl = pdl;
  const vllm_prism::Pq2PrologueParams q = vllm_prism::prologue_params(
      x, residual, res_out, rms_weight, gate, signs, hadamard_block, glu,
      rms_offset, eps, rms_group, gate_sigmoid);
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const cudaError_t err =
      vllm_prism::pq2_gemv_fused_launch(p, q, sms, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, op, ": launch failed: ", cudaGetErrorString(err));
  return out;
}
