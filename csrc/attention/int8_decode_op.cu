// The torch op around the INT8 split-KV decode kernel (int8_decode.cu): every layout and
// alignment the kernel assumes is checked here, so a caller gets a message, not a fault.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"
#include "attn_op_utils.h"
#include "int8_decode.cuh"

void int8_decode_attention(const torch::Tensor& q, const torch::Tensor& kv_cache,
                           const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                           const torch::Tensor& query_start_loc,
                           const std::optional<torch::Tensor>& req_ids, torch::Tensor& out,
                           torch::Tensor& part_o, torch::Tensor& part_lse, double scale,
                           int64_t num_segs, int64_t min_tiles) {
  const char* op = "int8_decode_attention";
  vllm_prism::check_attention_io(op, q, out, block_table, seq_lens, query_start_loc, req_ids);
  const int64_t hs = q.size(2);
  TORCH_CHECK(kv_cache.scalar_type() == torch::kInt8 && kv_cache.dim() == 4, op,
              ": kv_cache must be the int8 [blocks, kv heads, block size, content] cache");
  const int64_t nkv = kv_cache.size(1), block_size = kv_cache.size(2);
  const int64_t row = 2 * hs + 8;
  TORCH_CHECK(kv_cache.size(3) == row && kv_cache.stride(3) == 1 && kv_cache.stride(1) == row &&
                  kv_cache.stride(2) == nkv * row,
              op, ": kv_cache must be vLLM's NHD int8_per_token_head layout with rows of ", row,
              " bytes");
  TORCH_CHECK(vllm_prism::aligned_to(kv_cache, 16) && kv_cache.stride(0) % 16 == 0 &&
                  block_size % 16 == 0,
              op,
              ": kv_cache blocks must be 16-byte aligned with a block size that is a multiple "
              "of 16");
  TORCH_CHECK(vllm_prism::int8_decode_supported(static_cast<int>(hs), static_cast<int>(nkv)),
              op, ": no kernel for head size ", hs, " with ", nkv, " KV heads");
  TORCH_CHECK(q.size(1) % nkv == 0 && q.size(1) / nkv <= vllm_prism::kInt8DecodeMaxGroup, op,
              ": ", q.size(1), " query heads over ", nkv, " KV heads: at most ",
              vllm_prism::kInt8DecodeMaxGroup, " per KV head");
  const int64_t n_sel = req_ids.has_value() ? req_ids->size(0) : seq_lens.size(0);
  TORCH_CHECK(num_segs >= 1 && min_tiles >= 1, op, ": num_segs and min_tiles must be >= 1");
  if (num_segs > 1)
    vllm_prism::check_partials(op, part_o, part_lse, n_sel, 1, q.size(1), num_segs, hs);
  if (n_sel == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  vllm_prism::Int8DecodeParams p{};
  p.q = q.data_ptr();
  p.stride_qt = q.stride(0);
  p.stride_qh = q.stride(1);
  p.q_dtype = vllm_prism::half_dtype_code(q, op, "q");
  p.cache = kv_cache.data_ptr<int8_t>();
  p.stride_cb = kv_cache.stride(0);
  p.stride_cn = kv_cache.stride(2);
  p.block_table = block_table.data_ptr<int32_t>();
  p.stride_bt = block_table.stride(0);
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.qsl = query_start_loc.data_ptr<int32_t>();
  p.req_ids = req_ids.has_value() ? req_ids->data_ptr<int32_t>() : nullptr;
  p.out = out.data_ptr();
  p.stride_ot = out.stride(0);
  p.stride_oh = out.stride(1);
  p.out_dtype = vllm_prism::half_dtype_code(out, op, "out");
  if (num_segs > 1) {
    p.part_o = part_o.data_ptr<float>();
    p.part_lse = part_lse.data_ptr<float>();
    p.stride_pr = part_o.stride(0);
    p.stride_ph = part_o.stride(2);
    p.stride_ps = part_o.stride(3);
    p.stride_lr = part_lse.stride(0);
    p.stride_lh = part_lse.stride(2);
  }
  p.qk_scale = static_cast<float>(scale * 1.4426950408889634);
  p.group = static_cast<int>(q.size(1) / nkv);
  p.num_kv_heads = static_cast<int>(nkv);
  p.head_dim = static_cast<int>(hs);
  p.block_size = static_cast<int>(block_size);
  p.num_segs = static_cast<int>(num_segs);
  p.min_tiles = static_cast<int>(min_tiles);
  const cudaError_t err = vllm_prism::int8_decode_launch(
      p, static_cast<int>(n_sel), at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, op, ": launch failed: ", cudaGetErrorString(err));
}
