// Split-KV decode attention over vLLM's paged INT8 (int8_per_token_head) cache, torch-free
// (int8_decode.cu). One CTA serves one (request, segment): every KV head of the request, the
// context tiles of its segment, one query token.
//
// The cache is vLLM's NHD layout: slot -> head -> [K int8 (hd) | K scale f32 | V int8 (hd) |
// V scale f32]. A row is 2 * hd + 8 bytes, so rows are only 8 (K) or 4 (V) byte aligned, but
// the 16 slots of a tile, all heads together, are one contiguous 16-byte aligned run of
// 16 * heads * row bytes: the kernel copies those runs into shared memory with 16-byte
// cp.async (a pipeline of NSTAGES tiles) and builds the tensor-core operands from there.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace vllm_prism {

struct Int8DecodeParams {
  const void* q;  // [tokens, q heads, hd], fp16 or bf16, 16-byte aligned head rows
  int64_t stride_qt, stride_qh;  // elements
  int q_dtype;  // 1 fp16, 2 bf16
  const int8_t* cache;  // logical [blocks, kv heads, block size, 2 * hd + 8] in NHD order
  int64_t stride_cb, stride_cn;  // bytes: block, slot (= kv heads * row)
  const int32_t* block_table;
  int64_t stride_bt;
  const int32_t* seq_lens;
  const int32_t* qsl;  // query_start_loc: the query token of request r is row qsl[r]
  const int32_t* req_ids;  // selected requests (nullptr: request = blockIdx.x)
  void* out;  // [tokens, q heads, hd], written when num_segs == 1
  int64_t stride_ot, stride_oh;
  int out_dtype;  // 1 fp16, 2 bf16
  float* part_o;  // [selected, 1, q heads, num_segs, hd] fp32 partial outputs (num_segs > 1)
  float* part_lse;  // [selected, 1, q heads, num_segs] log2-sum-exp (-inf: empty segment)
  int64_t stride_pr, stride_ph, stride_ps;
  int64_t stride_lr, stride_lh;
  float qk_scale;  // softmax scale * log2(e)
  int group;  // query heads per KV head (<= 8)
  int num_kv_heads;
  int head_dim;
  int block_size;  // slots per block, a multiple of 16
  int num_segs;
  int min_tiles;  // a segment holds at least this many 16-slot tiles
};

constexpr int kInt8DecodeMaxGroup = 8;

// Whether a kernel is compiled for this head size and KV head count (64 / 128 / 256 and
// 1 / 2 / 4).
bool int8_decode_supported(int head_dim, int num_kv_heads);

// Launches grid (num_selected, num_segs) on `stream`.
cudaError_t int8_decode_launch(const Int8DecodeParams& p, int num_selected, cudaStream_t stream);

}  // namespace vllm_prism
