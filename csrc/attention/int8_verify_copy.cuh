// The stage copy both INT8 verification kernels (int8_verify.cu, int8_verify_wgmma.cu) make:
// a stage's (slot, head) rows of 2 hd + 8 bytes from the paged cache into shared rows of
// kSRow bytes by cp.async.
#pragma once

#include <cstdint>

#include "int8_attention.cuh"
#include "int8_tile.cuh"

namespace vllm_prism {
namespace attn {

// Copy thread `ct` (kTpr threads a row) issues its pieces of stage `st` (T 16-slot tiles from
// the segment's tile t0; the head's rows at `cache`, blocks by `bt`) into the stage buffer at
// `stage`; tiles past the context (n_tiles) are not copied (their slots are masked). With
// `vec16` (16-byte aligned blocks and slots) 16-byte pieces and one of 8, the rows starting
// `shift` (0 or 8) bytes into their shared rows; else 8-byte pieces.
template <int HD, int T, int kTpr, int kSRow>
__device__ __forceinline__ void copy_stage_rows(const Int8AttnParams& p, const uint8_t* cache,
                                                const int32_t* bt, int t0, int n_tiles,
                                                bool vec16, int shift, int st, int ct,
                                                uint8_t* stage) {
  constexpr int kSlots = 16;
  constexpr int kRow = 2 * HD + 8;
  const int row = ct / kTpr, sub = ct % kTpr;
  const int tl = t0 + st * T + row / kSlots;
  if (tl >= n_tiles) return;
  const int pos = tl * kSlots + row % kSlots;
  const uint8_t* src = cache + static_cast<int64_t>(bt[pos / p.block_size]) * p.stride_cb +
                       static_cast<int64_t>(pos % p.block_size) * p.stride_cn;
  const uint32_t dst = smem_u32(stage + row * kSRow);
  if (vec16) {
    // pieces j = 0..HD/8: 16 bytes each but one of 8 (the first where shift = 8, else last)
    constexpr int kPieces = HD / 8 + 1;
#pragma unroll
    for (int i = 0; i < (kPieces + kTpr - 1) / kTpr; ++i) {
      const int j = sub + kTpr * i;
      if (j < kPieces) {
        const bool half = shift == 0 ? j == HD / 8 : j == 0;
        if (half) cp_async8(dst + (shift == 0 ? 2 * HD : 8), src + (shift == 0 ? 2 * HD : 0));
        else cp_async16(dst + 16 * j, src + 16 * j - shift);
      }
    }
  } else {
#pragma unroll 4
    for (int j = sub; j < kRow / 8; j += kTpr) cp_async8(dst + 8 * j, src + 8 * j);
  }
}

}  // namespace attn
}  // namespace vllm_prism
