// Shared argument checks of the INT8 attention torch ops (int8_decode_op.cu,
// int8_verify_op.cu): alignment, dtypes, the step metadata and the partial-output buffers.
#pragma once

#include <optional>

#include <torch/all.h>

namespace vllm_prism {

inline bool aligned_to(const torch::Tensor& x, int bytes) {
  return reinterpret_cast<uintptr_t>(x.data_ptr()) % bytes == 0;
}

// 1 for float16, 2 for bfloat16 (the kernels' dtype codes); anything else is refused.
inline int half_dtype_code(const torch::Tensor& x, const char* op, const char* name) {
  if (x.scalar_type() == torch::kFloat16) return 1;
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16, op, ": ", name,
              " must be float16 or bfloat16");
  return 2;
}

inline void check_int32_vector(const torch::Tensor& x, const char* op, const char* name) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kInt32 && x.dim() == 1 &&
                  x.stride(0) == 1,
              op, ": ", name, " must be a contiguous int32 CUDA vector");
}

// q [tokens, heads, hs] with 16-byte aligned head rows; out shaped like it, rows 8-byte aligned;
// the block table, sequence lengths, query start offsets and selected requests of the step.
inline void check_attention_io(const char* op, const torch::Tensor& q, const torch::Tensor& out,
                               const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                               const torch::Tensor& query_start_loc,
                               const std::optional<torch::Tensor>& req_ids) {
  TORCH_CHECK(q.is_cuda() && q.dim() == 3 && q.stride(2) == 1, op,
              ": q must be a CUDA [tokens, heads, head_size] tensor, contiguous per head");
  TORCH_CHECK(aligned_to(q, 16) && (q.stride(0) * 2) % 16 == 0 && (q.stride(1) * 2) % 16 == 0,
              op, ": q head rows must be 16-byte aligned");
  TORCH_CHECK(out.sizes() == q.sizes() && out.stride(2) == 1 && aligned_to(out, 8) &&
                  (out.stride(0) * 2) % 8 == 0 && (out.stride(1) * 2) % 8 == 0,
              op, ": out must be shaped like q with 8-byte aligned head rows");
  TORCH_CHECK(block_table.is_cuda() && block_table.scalar_type() == torch::kInt32 &&
                  block_table.dim() == 2 && block_table.stride(1) == 1,
              op, ": block_table must be int32 [requests, blocks]");
  check_int32_vector(seq_lens, op, "seq_lens");
  check_int32_vector(query_start_loc, op, "query_start_loc");
  if (req_ids.has_value()) check_int32_vector(*req_ids, op, "req_ids");
}

// part_o fp32 [selected, rows, heads, segments, hs] (16-byte aligned rows) and part_lse fp32
// [selected, rows, heads, segments], read only when the context is split (num_segs > 1).
inline void check_partials(const char* op, const torch::Tensor& part_o,
                           const torch::Tensor& part_lse, int64_t n_sel, int64_t rows,
                           int64_t heads, int64_t num_segs, int64_t hs) {
  TORCH_CHECK(part_o.scalar_type() == torch::kFloat32 && part_o.dim() == 5 &&
                  part_o.size(0) >= n_sel && part_o.size(1) >= rows && part_o.size(2) == heads &&
                  part_o.size(3) >= num_segs && part_o.size(4) == hs && part_o.stride(4) == 1 &&
                  aligned_to(part_o, 16) && part_o.stride(0) % 4 == 0 &&
                  part_o.stride(1) % 4 == 0 && part_o.stride(2) % 4 == 0 &&
                  part_o.stride(3) % 4 == 0,
              op, ": part_o must be fp32 [selected, ", rows, ", heads, segments, head_size], "
              "rows 16-byte aligned");
  TORCH_CHECK(part_lse.scalar_type() == torch::kFloat32 && part_lse.dim() == 4 &&
                  part_lse.size(0) >= n_sel && part_lse.size(1) >= rows &&
                  part_lse.size(2) == heads && part_lse.size(3) >= num_segs &&
                  part_lse.stride(3) == 1,
              op, ": part_lse must be fp32 [selected, ", rows, ", heads, segments]");
}

}  // namespace vllm_prism
