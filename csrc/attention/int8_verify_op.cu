// The torch ops around the INT8 split-KV verification kernels (int8_verify.cu; its warpgroup-MMA
// form int8_verify_wgmma.cu, registered only where the extension has PRISM_HAS_SM90A): every
// layout and alignment the kernels assume is checked here, so a caller gets a message, not a
// fault.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../ops.h"
#include "attn_op_utils.h"

namespace {

// The checks both verification ops make on their arguments, and their parameters.
vllm_prism::Int8AttnParams verify_params(const char* op, const torch::Tensor& q,
                                         const torch::Tensor& kv_cache,
                                         const torch::Tensor& block_table,
                                         const torch::Tensor& seq_lens,
                                         const torch::Tensor& query_start_loc,
                                         const std::optional<torch::Tensor>& req_ids,
                                         torch::Tensor& out, torch::Tensor& part_o,
                                         torch::Tensor& part_lse, double scale, int64_t max_q,
                                         int64_t num_segs, int64_t min_tiles, int64_t pdl,
                                         int64_t& n_sel) {
  vllm_prism::Int8AttnParams p = vllm_prism::fill_int8_attn_params(
      op, q, kv_cache, block_table, seq_lens, query_start_loc, req_ids, out, part_o, part_lse,
      scale, max_q, num_segs, min_tiles, n_sel);
  TORCH_CHECK(pdl >= 0 && pdl <= 2, op, ": pdl must be 0, 1 or 2, not ", pdl);
  p.pdl = static_cast<int>(pdl);
  TORCH_CHECK(vllm_prism::aligned_to(kv_cache, 8) && kv_cache.stride(0) % 8 == 0 &&
                  kv_cache.stride(1) % 8 == 0 && kv_cache.stride(2) % 8 == 0 &&
                  p.block_size % 16 == 0,
              op, ": kv_cache rows must be 8-byte aligned, the block size a multiple of 16");
  TORCH_CHECK(p.group * max_q <= vllm_prism::kInt8VerifyMaxCols, op, ": ", max_q,
              " query tokens x ", p.group, " heads exceed ", vllm_prism::kInt8VerifyMaxCols,
              " columns");
  return p;
}

}  // namespace

void int8_verify_attention(const torch::Tensor& q, const torch::Tensor& kv_cache,
                           const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                           const torch::Tensor& query_start_loc,
                           const std::optional<torch::Tensor>& req_ids, torch::Tensor& out,
                           torch::Tensor& part_o, torch::Tensor& part_lse, double scale,
                           int64_t max_q, int64_t num_segs, int64_t min_tiles, bool int_qk,
                           int64_t dim_split, bool lazy_max, int64_t pdl) {
  const char* op = "int8_verify_attention";
  int64_t n_sel = 0;
  vllm_prism::Int8AttnParams p =
      verify_params(op, q, kv_cache, block_table, seq_lens, query_start_loc, req_ids, out,
                    part_o, part_lse, scale, max_q, num_segs, min_tiles, pdl, n_sel);
  TORCH_CHECK(dim_split == 1 || dim_split == 2, op, ": dim_split must be 1 or 2, not ",
              dim_split);
  p.int_qk = int_qk ? 1 : 0;
  p.dim_split = static_cast<int>(dim_split);
  p.lazy_max = lazy_max ? 1 : 0;
  TORCH_CHECK(vllm_prism::int8_verify_supported(p.head_dim), op, ": no kernel for head size ",
              p.head_dim);
  if (n_sel == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = vllm_prism::int8_verify_launch(
      p, static_cast<int>(n_sel), at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, op, ": launch failed: ", cudaGetErrorString(err));
}

#ifdef PRISM_HAS_SM90A
void int8_verify_wgmma_attention(const torch::Tensor& q, const torch::Tensor& kv_cache,
                                 const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                                 const torch::Tensor& query_start_loc,
                                 const std::optional<torch::Tensor>& req_ids, torch::Tensor& out,
                                 torch::Tensor& part_o, torch::Tensor& part_lse, double scale,
                                 int64_t max_q, int64_t num_segs, int64_t min_tiles,
                                 bool lazy_max, int64_t pdl, bool tma) {
  const char* op = "int8_verify_wgmma_attention";
  int64_t n_sel = 0;
  vllm_prism::Int8AttnParams p =
      verify_params(op, q, kv_cache, block_table, seq_lens, query_start_loc, req_ids, out,
                    part_o, part_lse, scale, max_q, num_segs, min_tiles, pdl, n_sel);
  p.lazy_max = lazy_max ? 1 : 0;
  TORCH_CHECK(vllm_prism::int8_verify_wgmma_supported(p.head_dim), op,
              ": no kernel for head size ", p.head_dim, " (128 and 256)");
  if (n_sel == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(prop->major == 9 && prop->minor == 0, op,
              ": needs compute capability 9.0 (Hopper), this GPU is ", prop->major, ".",
              prop->minor);
  TORCH_CHECK(!tma || vllm_prism::int8_verify_tma_layout(p, 2 * p.head_dim + 8), op,
              ": tma needs a slot's heads side by side at 8-byte offsets and a 16-byte aligned "
              "cache, slot and block stride (vLLM's NHD layout); this kv_cache has strides ",
              kv_cache.strides());
  const cudaError_t err = vllm_prism::int8_verify_wgmma_launch(
      p, tma ? kv_cache.size(0) : 0, static_cast<int>(n_sel),
      at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, op, ": launch failed: ", cudaGetErrorString(err));
}
#endif
