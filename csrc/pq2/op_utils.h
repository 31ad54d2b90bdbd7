// Shared argument checks, parameter filling and tile counters of the PQ2 torch ops
// (mma_int8_op.cu, mma_small_op.cu, gemv_int8_op.cu).
#pragma once

#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include <ATen/cuda/CUDAContext.h>
#include <torch/all.h>

#include "pq2_params.cuh"
#include "producer.cuh"

namespace vllm_prism {

inline int dtype_code(c10::ScalarType t, const char* op) {
  if (t == torch::kFloat16) return 1;
  if (t == torch::kBFloat16) return 2;
  TORCH_CHECK(t == torch::kFloat32, op, ": dtype must be float32, float16 or bfloat16");
  return 0;
}

inline void check_weight_planes(const char* op, const torch::Tensor& codes,
                                const torch::Tensor& scales) {
  TORCH_CHECK(codes.dtype() == torch::kInt32 && codes.dim() == 2 && codes.stride(1) == 1,
              op, ": codes must be int32 [N, K/16] with unit column stride");
  TORCH_CHECK(scales.dtype() == torch::kFloat16 && scales.dim() == 2 && scales.stride(1) == 1 &&
                  scales.stride(0) % 2 == 0 && scales.size(0) == codes.size(0),
              op, ": scales must be fp16 [N, G_pad] with an even row stride");
}

// The int8 activation rows every op reads: xq int8 [M, K] with 16-byte aligned rows, K that of
// the codes.
inline void check_int8_rows(const char* op, const torch::Tensor& codes, const torch::Tensor& xq) {
  TORCH_CHECK(xq.dtype() == torch::kInt8 && xq.dim() == 2 && xq.stride(1) == 1 &&
                  xq.stride(0) % 16 == 0,
              op, ": xq must be int8 [M, K] with 16-byte aligned rows");
  TORCH_CHECK(xq.size(1) == codes.size(1) * 16, op, ": xq has K = ", xq.size(1),
              ", codes have ", codes.size(1) * 16);
}

// The int8 activation of the tensor-core ops: the rows (check_int8_rows), their per-group
// scales sx (fp32) and sums qsum (int32) [M, G] sharing one row stride.
inline void check_int8_activation(const char* op, const torch::Tensor& codes,
                                  const torch::Tensor& xq, const torch::Tensor& sx,
                                  const torch::Tensor& qsum) {
  check_int8_rows(op, codes, xq);
  TORCH_CHECK(sx.dtype() == torch::kFloat32 && qsum.dtype() == torch::kInt32 &&
                  sx.stride(1) == 1 && qsum.stride(1) == 1 && sx.stride(0) == qsum.stride(0),
              op, ": sx (fp32) and qsum (int32) must be [M, G] with one row stride");
}

// Pointers, sizes, strides and dtypes every kernel reads (not split, pdl or qsum).
// A [1, width] row of `dtype` with unit column stride on x's device: the activation-side
// tensors of the GEMV with the producer in its launch.
inline void check_row(const char* op, const char* name, const torch::Tensor& t,
                      c10::ScalarType dtype, int64_t width, const torch::Tensor& x) {
  TORCH_CHECK(t.device() == x.device() && t.scalar_type() == dtype && t.dim() == 2 &&
                  t.size(0) == 1 && t.size(1) == width && t.stride(1) == 1,
              op, ": ", name, " must be ", dtype, " [1, ", width,
              "] with unit column stride on x's device");
}

// A 16-byte aligned start: 16-byte loads and stores of a row.
inline bool aligned16(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// The producer's prologue (Pq2PrologueParams) from the checked tensors of the GEMV with the
// producer in its launch (pq2_gemv_fused): pointers, dtypes, the 16-byte flags and, with
// signs, the Hadamard block (a power of two) as its log.
inline Pq2PrologueParams prologue_params(
    const torch::Tensor& x, const std::optional<torch::Tensor>& residual,
    const std::optional<torch::Tensor>& res_out, const std::optional<torch::Tensor>& rms_weight,
    const std::optional<torch::Tensor>& gate, const std::optional<torch::Tensor>& signs,
    int64_t hadamard_block, bool glu,
    double rms_offset, double eps, int64_t rms_group, bool gate_sigmoid) {
  Pq2PrologueParams q{};
  q.x = x.data_ptr();
  q.x_dtype = dtype_code(x.scalar_type(), "x");
  q.x_vec = aligned16(x);
  if (residual.has_value()) {
    q.res = residual->data_ptr();
    q.res_out = res_out->data_ptr();
    q.res_vec = aligned16(*residual) && aligned16(*res_out);
  }
  if (rms_weight.has_value()) {
    q.rms_w = rms_weight->data_ptr();
    q.rms_dtype = dtype_code(rms_weight->scalar_type(), "rms_weight");
  }
  q.rms_offset = static_cast<float>(rms_offset);
  q.eps = static_cast<float>(eps);
  q.rms_group = static_cast<int>(rms_group);
  if (gate.has_value()) {
    q.gate = gate->data_ptr();
    q.gate_vec = aligned16(*gate);
  }
  q.gate_sigmoid = gate_sigmoid;
  q.glu = glu;
  if (signs.has_value()) {
    q.signs = signs->data_ptr<float>();
    while ((int64_t{1} << q.log_b) < hadamard_block) ++q.log_b;
    q.inv_sqrt_b = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hadamard_block)));
  }
  return q;
}

inline void fill_common(Pq2LinearParams& p, const torch::Tensor& codes,
                        const torch::Tensor& scales, const torch::Tensor& xq,
                        const torch::Tensor& sx, const std::optional<torch::Tensor>& bias,
                        const torch::Tensor& out) {
  p.codes = codes.data_ptr<int32_t>();
  p.scales = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  p.xq = xq.data_ptr<int8_t>();
  p.sx = sx.data_ptr<float>();
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == codes.size(0),
                "bias must be contiguous with N = ", codes.size(0), " values");
    p.bias = bias->data_ptr();
    p.bias_dtype = dtype_code(bias->scalar_type(), "bias");
  }
  p.out = out.data_ptr();
  p.out_dtype = dtype_code(out.scalar_type(), "out");
  p.m = static_cast<int>(xq.size(0));
  p.n = static_cast<int>(codes.size(0));
  p.k = static_cast<int>(codes.size(1) * 16);
  p.stride_c = codes.stride(0);
  p.stride_s = scales.stride(0);
  p.stride_x = xq.stride(0);
  p.stride_g = sx.stride(0);
  p.stride_o = out.stride(0);
}

constexpr int64_t kSplitCounters = 65536;  // output tiles a launch with counters may have

// The tile counters of the current stream (K splits of mma_int8.cu, shared tiles of
// mma_bulk.cu): zeros, left at zero by every launch (the last CTA of a tile resets its
// counter), so launches in one stream share them and launches in different streams never do.
inline int* split_counters(const c10::Device& device) {
  static std::mutex mu;
  static std::map<std::pair<int, int64_t>, torch::Tensor> by_stream;
  const auto key = std::make_pair(static_cast<int>(device.index()),
                                  static_cast<int64_t>(at::cuda::getCurrentCUDAStream().id()));
  std::lock_guard<std::mutex> lock(mu);
  auto it = by_stream.find(key);
  if (it == by_stream.end()) {
    it = by_stream
             .emplace(key,
                      torch::zeros({kSplitCounters}, torch::dtype(torch::kInt32).device(device)))
             .first;
  }
  return it->second.data_ptr<int>();
}

}  // namespace vllm_prism
