// Split-KV attention over vLLM's paged INT8 (int8_per_token_head) cache, torch-free: the
// parameters both kernels read, and their launchers.
//
// * decode (int8_decode.cu): one query token per request; one CTA per (request, segment) for
//   every KV head. vLLM's NHD layout puts a slot's heads side by side ([K int8 (hd) | K scale
//   f32 | V int8 (hd) | V scale f32] per head, 2 * hd + 8 bytes: rows only 8 (K) or 4 (V) byte
//   aligned), so the 16 slots of a tile, all heads together, are one contiguous 16-byte aligned
//   run, copied into shared memory with 16-byte cp.async.
// * verification (int8_verify.cu): 2..8 query tokens folded into the GQA group (column = token
//   x group + head), prefix and causal tail in one pass; one CTA per (request, KV head,
//   segment) copies its head's rows with 8-byte cp.async (any layout).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace vllm_prism {

struct Int8AttnParams {
  const void* q;  // [tokens, q heads, hd], fp16 or bf16, 16-byte aligned head rows
  int64_t stride_qt, stride_qh;  // elements
  int q_dtype;  // 1 fp16, 2 bf16
  const int8_t* cache;  // logical [blocks, kv heads, block size, 2 * hd + 8]
  int64_t stride_cb, stride_ch, stride_cn;  // bytes: block, head, slot
  const int32_t* block_table;
  int64_t stride_bt;
  const int32_t* seq_lens;
  const int32_t* qsl;  // query_start_loc: request r's query tokens are rows qsl[r]..
  const int32_t* req_ids;  // selected requests (nullptr: request = blockIdx.x)
  void* out;  // [tokens, q heads, hd], written when num_segs == 1
  int64_t stride_ot, stride_oh;
  int out_dtype;  // 1 fp16, 2 bf16
  void* part_o;  // [selected, max_q, q heads, num_segs, hd] partial outputs (num_segs > 1)
  int part_dtype;  // part_o: 0 fp32, 1 fp16, 2 bf16 (out_dtype's codes)
  float* part_lse;  // [selected, max_q, q heads, num_segs] log2-sum-exp (-inf: empty segment)
  int64_t stride_pr, stride_pt, stride_ph, stride_ps;
  int64_t stride_lr, stride_lt, stride_lh;
  float qk_scale;  // softmax scale * log2(e)
  int group;  // query heads per KV head
  int num_kv_heads;
  int head_dim;
  int max_q;  // query tokens of the widest request (1 for decode)
  int block_size;  // slots per block, a multiple of 16
  int num_segs;
  int min_tiles;  // a segment holds at least this many 16-slot tiles
  int int_qk;  // verification: 1 runs Q.K on the int8 tensor cores (int8 query), 0 exact
  // decode: warps a (16-slot tile, KV head), each over 1 / dim_split of hd (1, 2); verification:
  // 2 lets the pair of warps of a tile split S^T's head dimension where it can, 1 its columns
  int dim_split;
  // verification (exact Q.K): 1 keeps each column's running maximum and the running V-scale
  // maximum while a stage's scores and scales stay within bounds of them (one barrier a stage
  // fewer, no maxima exchanged), the exact per-stage softmax otherwise; 0 the exact one always
  int lazy_max;
  // programmatic dependent launch: 0 none; 1 the kernel copies the tiles written before this
  // step (every slot before the request's first query token) while the kernel before it
  // finishes, reads the query, the new tiles and the outputs' buffers only after
  // griddepcontrol.wait, and lets the next kernel (the merge) launch at its start; 2 the same
  // but the next kernel launches after the stage loop (the caller passes 0 where other slots
  // may be new: a drafter's context)
  int pdl;
  // decode: 1 copies each 16-slot tile by one bulk-copy request (sm_90+), 0 by cp.async
  int bulk;
};

constexpr int kInt8DecodeMaxGroup = 8;
constexpr int kInt8VerifyMaxCols = 48;  // query tokens x heads of a group (6 n-tiles of 8)

// Whether a decode kernel is compiled for this head size and KV head count (64 / 128 / 256 and
// 1 / 2 / 4).
bool int8_decode_supported(int head_dim, int num_kv_heads);

// Decode: grid (num_selected, num_segs) on `stream`, 4 * p.dim_split warps a CTA.
cudaError_t int8_decode_launch(const Int8AttnParams& p, int num_selected, cudaStream_t stream);

// Whether a verification kernel is compiled for this head size (64 / 128 / 256).
bool int8_verify_supported(int head_dim);

// Verification: grid (num_selected, p.num_kv_heads, num_segs) on `stream`.
cudaError_t int8_verify_launch(const Int8AttnParams& p, int num_selected, cudaStream_t stream);

// The verification kernel on Hopper's warpgroup MMA (int8_verify_wgmma.cu, built for sm_90a only:
// declared here, defined where the extension has PRISM_HAS_SM90A): head sizes 128 and 256, exact
// Q.K (p.int_qk 0); the same grid, partials, lazy maxima and PDL as int8_verify_launch.
// num_blocks > 0 (the cache's blocks): its producer copies a stage's 16-slot tiles as TMA boxes
// of a tensor map over the cache's rows, which needs int8_verify_tma_layout (a slot's heads side
// by side, `row` bytes each at 8-byte offsets; 16-byte aligned cache, slots and blocks;
// cudaErrorNotSupported otherwise); 0: its rows by cp.async (any layout).
bool int8_verify_wgmma_supported(int head_dim);
// (Inline here so that a host program checks it against cuda_decode.tma_layout_problem:
// tests/kernels/test_csrc_compile.py.)
inline bool int8_verify_tma_layout(const Int8AttnParams& p, int64_t row) {
  return reinterpret_cast<uintptr_t>(p.cache) % 16 == 0 && p.stride_cb % 16 == 0 &&
         p.stride_cn % 16 == 0 && p.stride_ch % 8 == 0 && p.stride_ch >= row &&
         (p.num_kv_heads - 1) * p.stride_ch + row <= p.stride_cn;
}
cudaError_t int8_verify_wgmma_launch(const Int8AttnParams& p, int64_t num_blocks,
                                     int num_selected, cudaStream_t stream);

}  // namespace vllm_prism
