// The torch op around the INT8 split-KV decode kernel (int8_decode.cu): every layout and
// alignment the kernel assumes is checked here, so a caller gets a message, not a fault.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"
#include "attn_op_utils.h"

void int8_decode_attention(const torch::Tensor& q, const torch::Tensor& kv_cache,
                           const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                           const torch::Tensor& query_start_loc,
                           const std::optional<torch::Tensor>& req_ids, torch::Tensor& out,
                           torch::Tensor& part_o, torch::Tensor& part_lse, double scale,
                           int64_t num_segs, int64_t min_tiles, int64_t dim_split, int64_t pdl,
                           bool bulk) {
  const char* op = "int8_decode_attention";
  int64_t n_sel = 0;
  TORCH_CHECK(dim_split == 1 || dim_split == 2, op, ": dim_split must be 1 or 2, not ",
              dim_split);
  vllm_prism::Int8AttnParams p = vllm_prism::fill_int8_attn_params(
      op, q, kv_cache, block_table, seq_lens, query_start_loc, req_ids, out, part_o, part_lse,
      scale, 1, num_segs, min_tiles, n_sel);
  p.dim_split = static_cast<int>(dim_split);
  TORCH_CHECK(pdl >= 0 && pdl <= 2, op, ": pdl must be 0, 1 or 2, not ", pdl);
  p.pdl = static_cast<int>(pdl);
  p.bulk = bulk ? 1 : 0;
  const int64_t row = 2 * p.head_dim + 8;
  TORCH_CHECK(kv_cache.stride(1) == row && kv_cache.stride(2) == p.num_kv_heads * row, op,
              ": kv_cache must be vLLM's NHD int8_per_token_head layout with rows of ", row,
              " bytes");
  TORCH_CHECK(vllm_prism::aligned_to(kv_cache, 16) && kv_cache.stride(0) % 16 == 0 &&
                  p.block_size % 16 == 0,
              op,
              ": kv_cache blocks must be 16-byte aligned with a block size that is a multiple "
              "of 16");
  TORCH_CHECK(vllm_prism::int8_decode_supported(p.head_dim, p.num_kv_heads), op,
              ": no kernel for head size ", p.head_dim, " with ", p.num_kv_heads, " KV heads");
  TORCH_CHECK(p.group <= vllm_prism::kInt8DecodeMaxGroup, op, ": ", q.size(1),
              " query heads over ", p.num_kv_heads, " KV heads: at most ",
              vllm_prism::kInt8DecodeMaxGroup, " per KV head");
  if (n_sel == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  TORCH_CHECK(!bulk || at::cuda::getCurrentDeviceProperties()->major >= 9, op,
              ": bulk copies need compute capability 9.0 or newer (cp.async.bulk); pass "
              "bulk=False");
  const cudaError_t err = vllm_prism::int8_decode_launch(
      p, static_cast<int>(n_sel), at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, op, ": launch failed: ", cudaGetErrorString(err));
}
