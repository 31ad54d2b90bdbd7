// Shared argument checks and parameter filling of the INT8 attention torch ops
// (int8_decode_op.cu, int8_verify_op.cu): alignment, dtypes, the step metadata, the
// partial-output buffers, and the Int8AttnParams both kernels read.
#pragma once

#include <optional>

#include <torch/all.h>

#include "int8_attention.cuh"

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

// part_o fp32 or bf16 [selected, rows, heads, segments, hs] (rows 16-byte aligned, 8-byte
// in bf16) and part_lse fp32 [selected, rows, heads, segments], read only when the context is
// split (num_segs > 1).
inline void check_partials(const char* op, const torch::Tensor& part_o,
                           const torch::Tensor& part_lse, int64_t n_sel, int64_t rows,
                           int64_t heads, int64_t num_segs, int64_t hs) {
  const bool half = part_o.scalar_type() == torch::kBFloat16 ||
                    part_o.scalar_type() == torch::kHalf;
  TORCH_CHECK((half || part_o.scalar_type() == torch::kFloat32) && part_o.dim() == 5 &&
                  part_o.size(0) >= n_sel && part_o.size(1) >= rows && part_o.size(2) == heads &&
                  part_o.size(3) >= num_segs && part_o.size(4) == hs && part_o.stride(4) == 1 &&
                  aligned_to(part_o, half ? 8 : 16) && part_o.stride(0) % 4 == 0 &&
                  part_o.stride(1) % 4 == 0 && part_o.stride(2) % 4 == 0 &&
                  part_o.stride(3) % 4 == 0,
              op, ": part_o must be fp32, fp16 or bf16 [selected, ", rows, ", heads, "
              "segments, head_size], rows 16-byte (fp16, bf16: 8-byte) aligned");
  TORCH_CHECK(part_lse.scalar_type() == torch::kFloat32 && part_lse.dim() == 4 &&
                  part_lse.size(0) >= n_sel && part_lse.size(1) >= rows &&
                  part_lse.size(2) == heads && part_lse.size(3) >= num_segs &&
                  part_lse.stride(3) == 1,
              op, ": part_lse must be fp32 [selected, ", rows, ", heads, segments]");
}

// The int8 cache's shape ([blocks, kv heads, block size, 2 * hs + 8], rows contiguous), the
// GQA split, and every parameter but the layout checks each op makes of its own; the
// partials are checked (and read) only when num_segs > 1. num_selected: the CTAs' first grid
// dimension.
inline Int8AttnParams fill_int8_attn_params(
    const char* op, const torch::Tensor& q, const torch::Tensor& kv_cache,
    const torch::Tensor& block_table, const torch::Tensor& seq_lens,
    const torch::Tensor& query_start_loc, const std::optional<torch::Tensor>& req_ids,
    torch::Tensor& out, torch::Tensor& part_o, torch::Tensor& part_lse, double scale,
    int64_t max_q, int64_t num_segs, int64_t min_tiles, int64_t& num_selected) {
  check_attention_io(op, q, out, block_table, seq_lens, query_start_loc, req_ids);
  const int64_t hs = q.size(2);
  TORCH_CHECK(kv_cache.scalar_type() == torch::kInt8 && kv_cache.dim() == 4 &&
                  kv_cache.size(3) == 2 * hs + 8 && kv_cache.stride(3) == 1,
              op, ": kv_cache must be the int8_per_token_head cache [blocks, kv heads, block "
              "size, ", 2 * hs + 8, "] with contiguous rows");
  const int64_t nkv = kv_cache.size(1);
  TORCH_CHECK(q.size(1) % nkv == 0, op, ": ", q.size(1), " query heads over ", nkv,
              " KV heads");
  TORCH_CHECK(num_segs >= 1 && min_tiles >= 1 && max_q >= 1, op,
              ": num_segs, min_tiles and max_q must be >= 1");
  num_selected = req_ids.has_value() ? req_ids->size(0) : seq_lens.size(0);
  Int8AttnParams p{};
  if (num_segs > 1) {
    check_partials(op, part_o, part_lse, num_selected, max_q, q.size(1), num_segs, hs);
    p.part_o = part_o.data_ptr();
    p.part_dtype =
        part_o.scalar_type() == torch::kFloat32 ? 0 : half_dtype_code(part_o, op, "part_o");
    p.part_lse = part_lse.data_ptr<float>();
    p.stride_pr = part_o.stride(0);
    p.stride_pt = part_o.stride(1);
    p.stride_ph = part_o.stride(2);
    p.stride_ps = part_o.stride(3);
    p.stride_lr = part_lse.stride(0);
    p.stride_lt = part_lse.stride(1);
    p.stride_lh = part_lse.stride(2);
  }
  p.q = q.data_ptr();
  p.stride_qt = q.stride(0);
  p.stride_qh = q.stride(1);
  p.q_dtype = half_dtype_code(q, op, "q");
  p.cache = kv_cache.data_ptr<int8_t>();
  p.stride_cb = kv_cache.stride(0);
  p.stride_ch = kv_cache.stride(1);
  p.stride_cn = kv_cache.stride(2);
  p.block_table = block_table.data_ptr<int32_t>();
  p.stride_bt = block_table.stride(0);
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.qsl = query_start_loc.data_ptr<int32_t>();
  p.req_ids = req_ids.has_value() ? req_ids->data_ptr<int32_t>() : nullptr;
  p.out = out.data_ptr();
  p.stride_ot = out.stride(0);
  p.stride_oh = out.stride(1);
  p.out_dtype = half_dtype_code(out, op, "out");
  p.qk_scale = static_cast<float>(scale * 1.4426950408889634);
  p.group = static_cast<int>(q.size(1) / nkv);
  p.num_kv_heads = static_cast<int>(nkv);
  p.head_dim = static_cast<int>(hs);
  p.max_q = static_cast<int>(max_q);
  p.block_size = static_cast<int>(kv_cache.size(2));
  p.num_segs = static_cast<int>(num_segs);
  p.min_tiles = static_cast<int>(min_tiles);
  return p;
}

}  // namespace vllm_prism
