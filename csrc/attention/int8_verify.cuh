// Split-KV verification attention over vLLM's paged INT8 (int8_per_token_head) cache,
// torch-free (int8_verify.cu): 2..8 query tokens per request (speculative verification), the
// tokens folded into the GQA group (column c = token * group + head), prefix and causal tail
// in one pass. One CTA serves one (request, KV head, segment).
//
// Unlike the decode kernel it reads one KV head's rows, so any layout works (NHD or HND): each
// (slot, head) row of 2 * hd + 8 bytes is 8-byte aligned and is copied into shared memory with
// 8-byte cp.async.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace vllm_prism {

struct Int8VerifyParams {
  const void* q;  // [tokens, q heads, hd], fp16 or bf16, 16-byte aligned head rows
  int64_t stride_qt, stride_qh;  // elements
  int q_dtype;  // 1 fp16, 2 bf16
  const int8_t* cache;  // logical [blocks, kv heads, block size, 2 * hd + 8]
  int64_t stride_cb, stride_ch, stride_cn;  // bytes: block, head, slot (each a multiple of 8)
  const int32_t* block_table;
  int64_t stride_bt;
  const int32_t* seq_lens;
  const int32_t* qsl;  // query_start_loc: request r's query tokens are rows qsl[r]..qsl[r+1]-1
  const int32_t* req_ids;  // selected requests (nullptr: request = blockIdx.x)
  void* out;  // [tokens, q heads, hd], written when num_segs == 1
  int64_t stride_ot, stride_oh;
  int out_dtype;  // 1 fp16, 2 bf16
  float* part_o;  // [selected, max_q, q heads, num_segs, hd] fp32 partial outputs
  float* part_lse;  // [selected, max_q, q heads, num_segs] log2-sum-exp (-inf: empty)
  int64_t stride_pr, stride_pt, stride_ph, stride_ps;
  int64_t stride_lr, stride_lt, stride_lh;
  float qk_scale;  // softmax scale * log2(e)
  int group;  // query heads per KV head
  int max_q;  // query tokens of the widest request (group * max_q <= kInt8VerifyMaxCols)
  int head_dim;
  int block_size;  // slots per block, a multiple of 16
  int num_segs;
  int min_tiles;
};

constexpr int kInt8VerifyMaxCols = 48;  // query tokens x heads of a group (6 n-tiles of 8)

// Whether a kernel is compiled for this head size (64 / 128 / 256).
bool int8_verify_supported(int head_dim);

// Launches grid (num_selected, kv heads, num_segs) on `stream`.
cudaError_t int8_verify_launch(const Int8VerifyParams& p, int num_selected, int num_kv_heads,
                               cudaStream_t stream);

}  // namespace vllm_prism
