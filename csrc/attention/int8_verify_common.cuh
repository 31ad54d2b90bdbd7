// What both INT8 verification kernels (int8_verify.cu on mma.sync, int8_verify_wgmma.cu on
// warpgroup MMA) share apart from their MMAs and the layout of their operands: the CTA's share
// of the request's context (VerifyWork), the stage copy (a stage's (slot, head) rows of
// 2 hd + 8 bytes from the paged cache into shared rows of kSRow bytes by cp.async), the
// softmax on a lane's two S^T rows (K scales and causal mask, tile maxima and sums, the lazy
// and the exact column update, the stage's V-scale maximum), the first stage's issue around
// the programmatic-dependent-launch wait, a column's output (direct or the segment's
// partial), and the host side: the launch with its shared-memory attributes and the n-tile
// dispatch.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "int8_attention.cuh"
#include "int8_tile.cuh"

namespace vllm_prism {
namespace attn {

// The share of its request that a verification CTA (request `sel` of the call, KV head `kvh`,
// segment `seg`) covers: stages of T 16-slot tiles from tile t0, and where its head's rows lie
// in the cache.
struct VerifyWork {
  int q_start, seq_len;
  int prefix;  // context tokens before the request's first query token
  int n_cols;  // query tokens x query heads of the KV head
  int n_tiles, t0, n_stages;
  const int32_t* bt;     // the request's block-table row
  const uint8_t* cache;  // the KV head's bytes of block 0, slot 0

  // False where the request has no query token (the CTA has nothing to do).
  template <int T>
  __device__ __forceinline__ bool init(const Int8AttnParams& p, int sel, int kvh, int seg) {
    const int req = p.req_ids != nullptr ? p.req_ids[sel] : sel;
    q_start = p.qsl[req];
    const int q_len = min(p.qsl[req + 1] - q_start, p.max_q);
    if (q_len <= 0) return false;
    seq_len = p.seq_lens[req];
    prefix = max(seq_len - q_len, 0);
    n_cols = q_len * p.group;
    n_tiles = (seq_len + kTileSlots - 1) / kTileSlots;
    int tps = max((n_tiles + p.num_segs - 1) / p.num_segs, p.min_tiles);
    tps = (tps + T - 1) / T * T;
    t0 = seg * tps;
    const int t1 = min(t0 + tps, n_tiles);
    n_stages = t1 > t0 ? (t1 - t0 + T - 1) / T : 0;
    bt = p.block_table + static_cast<int64_t>(req) * p.stride_bt;
    cache = reinterpret_cast<const uint8_t*>(p.cache) + static_cast<int64_t>(kvh) * p.stride_ch;
    return true;
  }
};

// Whether the stage copy takes 16-byte pieces: blocks and slots 16-byte aligned. (Not a
// VerifyWork member: a bool member is kept as a byte and tested again at each copy.)
__device__ __forceinline__ bool verify_vec16(const Int8AttnParams& p) {
  return reinterpret_cast<uintptr_t>(p.cache) % 16 == 0 && p.stride_cb % 16 == 0 &&
         p.stride_cn % 16 == 0;
}

// Where KV head `kvh`'s rows start mod 16 (0 or 8) with 16-byte pieces, and so does each row
// in its shared row; 0 without them.
__device__ __forceinline__ int verify_shift(const Int8AttnParams& p, int kvh, bool vec16) {
  return vec16 ? static_cast<int>((static_cast<int64_t>(kvh) * p.stride_ch) % 16) : 0;
}

// The context position of row `row` (0 .. 16 T - 1) of stage `st`, or -1 past the context's
// tiles (w.n_tiles: not copied, their slots are masked).
template <int T>
__device__ __forceinline__ int stage_row_pos(const VerifyWork& w, int st, int row) {
  const int tl = w.t0 + st * T + row / kTileSlots;
  return tl < w.n_tiles ? tl * kTileSlots + row % kTileSlots : -1;
}

// The cache row of position `pos` of the KV head, its block `blk` (the block table's entry).
__device__ __forceinline__ const uint8_t* cache_row(const Int8AttnParams& p, const VerifyWork& w,
                                                    int pos, int blk) {
  return w.cache + static_cast<int64_t>(blk) * p.stride_cb +
         static_cast<int64_t>(pos % p.block_size) * p.stride_cn;
}

// Copy thread `sub` of a row's kTpr issues its pieces of the row `src` into the shared row at
// `dst`. With `vec16` 16-byte pieces and one of 8, the row starting `shift` bytes into its
// shared row; else 8-byte pieces.
template <int HD, int kTpr>
__device__ __forceinline__ void copy_row(const uint8_t* src, uint32_t dst, bool vec16, int shift,
                                         int sub) {
  constexpr int kRow = 2 * HD + 8;
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

// Copy thread `ct` (kTpr threads a row) issues its pieces of stage `st` (T 16-slot tiles from
// the segment's tile w.t0) into the stage buffer at `stage`; tiles past the context
// (w.n_tiles) are not copied (their slots are masked).
template <int HD, int T, int kTpr, int kSRow>
__device__ __forceinline__ void copy_stage_rows(const Int8AttnParams& p, const VerifyWork& w,
                                                bool vec16, int shift, int st, int ct,
                                                uint8_t* stage) {
  const int row = ct / kTpr;
  const int pos = stage_row_pos<T>(w, st, row);
  if (pos < 0) return;
  copy_row<HD, kTpr>(cache_row(p, w, pos, w.bt[pos / p.block_size]),
                     smem_addr(stage + row * kSRow), vec16, shift, ct % kTpr);
}

// ---- The softmax pieces both kernels run on a lane's two S^T rows (g and g + 8 of a 16-slot
// tile) for each of its columns.

// Lazy maxima: how far (log2) a score may exceed its column's running maximum (P <= 2^8 in fp16).
constexpr float kLazyHeadroom = 8.f;
// and how far a row's V scale may exceed the running V-scale maximum the lazy P is scaled by:
// P times the ratio stays <= 2^14 in fp16 (its largest finite value is 65504). A stage whose
// V scales pass the running maximum by less stays lazy (before, the 2026-12-06 profile: about
// a fifth of the stages were redone exactly on a V-scale record, most of them a few percent
// past it).
constexpr float kLazyVScaleHeadroom = 64.f;

// A lane's two rows of a tile: their positions, K and V scales (a V scale past the context is
// 0: those slots hold garbage), and whether the tile reaches the causal tail.
struct TileRows {
  int pg, pg8;
  float ks_g, ks_g8, vs_g, vs_g8;
  bool masked;
};

// The rows rg and rg + 8 of the tile that starts at position pos0, whose shared rows are row_g
// and row_g8 (K bytes, K scale, V bytes, V scale).
template <int HD>
__device__ __forceinline__ TileRows tile_rows(const VerifyWork& w, const uint8_t* row_g,
                                              const uint8_t* row_g8, int pos0, int rg,
                                              int rg8) {
  TileRows r;
  r.pg = pos0 + rg;
  r.pg8 = pos0 + rg8;
  r.ks_g = ld_f32(row_g + HD);
  r.ks_g8 = ld_f32(row_g8 + HD);
  r.vs_g = ld_f32(row_g + 2 * HD + 4);
  r.vs_g8 = ld_f32(row_g8 + 2 * HD + 4);
  if (r.pg >= w.seq_len) r.vs_g = 0.f;
  if (r.pg8 >= w.seq_len) r.vs_g8 = 0.f;
  r.masked = pos0 + kTileSlots - 1 > w.prefix;
  return r;
}

// Column col's two scores: the rows' K scales, and -inf past the column's last visible
// position (query token col / group sees positions <= prefix + token).
__device__ __forceinline__ void scale_and_mask(const Int8AttnParams& p, const VerifyWork& w,
                                               const TileRows& r, int col, float& sa,
                                               float& sb) {
  float a = sa * r.ks_g, b = sb * r.ks_g8;
  if (r.masked) {
    const int lim = min(w.prefix + col / p.group, w.seq_len - 1);
    if (r.pg > lim) a = -INFINITY;
    if (r.pg8 > lim) b = -INFINITY;
  }
  sa = a;
  sb = b;
}

// The maximum (or sum) of a column over the tile's 16 rows: the 8 lanes that share t.
__device__ __forceinline__ float tile_rows_max(float sa, float sb) {
  float mx = fmaxf(sa, sb);
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  return mx;
}

__device__ __forceinline__ float tile_rows_sum(float ls) {
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) ls += __shfl_xor_sync(0xffffffffu, ls, o);
  return ls;
}

// Whether a lane's two rows leave the lazy path's V-scale bound (kLazyVScaleHeadroom) against
// the running V-scale maximum run_vmax.
__device__ __forceinline__ bool lazy_vscale_over(const TileRows& r, float run_vmax) {
  return fmaxf(r.vs_g, r.vs_g8) > run_vmax * kLazyVScaleHeadroom;
}

// The lazy path's P of one column: the scores against the running maximum mo as it stands
// (`over` set where a score exceeds it by more than kLazyHeadroom, or the column has none),
// P scaled by the rows' V scales over the running V-scale maximum (inv_ref: its inverse) into
// pa / pb; returns the row sum's increment.
__device__ __forceinline__ float lazy_column(float mo, float sa, float sb, const TileRows& r,
                                             float inv_ref, bool& over, float& pa, float& pb) {
  const float hi = fmaxf(sa, sb);
  over |= mo == -INFINITY ? hi > -INFINITY : hi - mo > kLazyHeadroom;
  const float mu = mo == -INFINITY ? 0.f : mo;
  const float ea = exp2f(sa - mu), eb = exp2f(sb - mu);
  pa = ea * r.vs_g * inv_ref;
  pb = eb * r.vs_g8 * inv_ref;
  return ea + eb;
}

// The exact path's update of one column: the running maximum m raised to the stage's maximum
// ms, the row sum l rescaled and increased, P scaled by the rows' V scales over the stage's
// V-scale maximum (inv_vmax: its inverse) into pa / pb; returns the accumulator's softmax
// factor.
__device__ __forceinline__ float exact_column(float& m, float& l, float ms, float sa, float sb,
                                              const TileRows& r, float inv_vmax, float& pa,
                                              float& pb) {
  const float mo = m;
  const float mn = fmaxf(mo, ms);
  const float mu = mn == -INFINITY ? 0.f : mn;
  const float a = mn == mo ? 1.f : exp2f(mo - mu);  // mn > mo: finite
  m = mn;
  const float ea = exp2f(sa - mu), eb = exp2f(sb - mu);
  l = l * a + ea + eb;
  pa = ea * r.vs_g * inv_vmax;
  pb = eb * r.vs_g8 * inv_vmax;
  return a;
}

// The V scales' maximum over a stage's slots before the context's end (rows of kSRow bytes
// from `base`), the same in every lane; with the running maximum: the new one, the ratio of
// the old to it (the accumulators' factor) and its inverse.
struct StageVScale {
  float new_vmax, vr, inv_vmax;
};

template <int HD, int kSRow, int kStageSlots>
__device__ __forceinline__ StageVScale stage_vscale(const uint8_t* base, int stage_pos,
                                                    int seq_len, float run_vmax) {
  const int lane = threadIdx.x & 31;
  float vmax = 0.f;
#pragma unroll
  for (int r = lane; r < kStageSlots; r += 32) {
    if (stage_pos + r < seq_len) vmax = fmaxf(vmax, ld_f32(base + r * kSRow + 2 * HD + 4));
  }
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, o));
  StageVScale v;
  v.new_vmax = fmaxf(run_vmax, vmax);
  v.vr = v.new_vmax > run_vmax ? run_vmax / v.new_vmax : 1.f;
  v.inv_vmax = 1.f / v.new_vmax;
  return v;
}

// Stage 0 through `issue(0)` and the grid-dependency wait: with PDL, stage 0 starts before
// griddepcontrol.wait where its tiles lie wholly before the request's first query token
// (earlier steps wrote them), else after it; the kernel lets its dependents launch at its
// start where p.pdl says so (1). Ends with the stage's cp.async group committed.
template <int T, class Issue>
__device__ __forceinline__ void start_first_stage(const Int8AttnParams& p, const VerifyWork& w,
                                                  Issue&& issue) {
  const bool early =
      p.pdl && w.n_stages > 0 && min(w.t0 + T, w.n_tiles) * kTileSlots <= w.prefix;
  if (early) issue(0);
  pdl_trigger(p.pdl, 1);
  pdl_wait();
  if (!early && w.n_stages > 0) issue(0);
  cp_async_commit();
}

// Column `col` (= token x group + head) of KV head kvh's GQA group: its query token tq and
// query head hq. inv_group = 1 / group: the token by a float product instead of an integer
// division (a column is below 64, so (col + 0.5) / group stays at least 1 / (2 group) away from
// an integer, far past the product's rounding).
struct ColumnQuery {
  int tq, hq;
};
__device__ __forceinline__ ColumnQuery column_query(int col, int kvh, int group, float inv_group) {
  const int tq = static_cast<int>((static_cast<float>(col) + 0.5f) * inv_group);
  return {tq, kvh * group + (col - tq * group)};
}

// Four consecutive dimensions from `d` of query token `tq`, query head `hq`: into the output
// where the call has one segment (`direct`), else into segment `seg`'s partial.
__device__ __forceinline__ void store_column(const Int8AttnParams& p, int sel, int seg,
                                             int q_start, bool direct, int tq, int hq, int d,
                                             const float (&o)[4]) {
  if (direct) {
    uint8_t* op = reinterpret_cast<uint8_t*>(p.out) +
                  (static_cast<int64_t>(q_start + tq) * p.stride_ot +
                   static_cast<int64_t>(hq) * p.stride_oh + d) * 2;
    store_out(op, p.out_dtype, o);
  } else {
    store_partial(p.part_o, p.part_dtype,
                  sel * p.stride_pr + tq * p.stride_pt + hq * p.stride_ph + seg * p.stride_ps + d,
                  o);
  }
}

// Launch `Kernel` (threads a CTA, smem bytes of dynamic shared memory) over (selected
// requests, KV heads, segments / segs_per_cta), its attributes set once: the dynamic shared
// memory and the largest carveout (the driver's default may leave room for one CTA). `kp` is
// the kernel's parameter where it is not p itself (a struct that holds p).
template <auto Kernel, class KParams = Int8AttnParams>
cudaError_t launch_verify(const Int8AttnParams& p, int num_selected, int threads, int smem,
                          cudaStream_t stream, int segs_per_cta = 1,
                          const KParams* kp = nullptr) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return attr;
  static const cudaError_t carve = cudaFuncSetAttribute(
      Kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (carve != cudaSuccess) return carve;
  const int ctas = (p.num_segs + segs_per_cta - 1) / segs_per_cta;
  if constexpr (std::is_same_v<KParams, Int8AttnParams>) {
    if (kp == nullptr) kp = &p;
  }
  return launch_kernel(Kernel, dim3(num_selected, p.num_kv_heads, ctas), threads, smem, stream,
                       p, *kp);
}

// `launch(std::integral_constant<int, NT>{})` for the n-tiles of 8 columns the widest
// request needs (1..6; the registers follow them); cudaErrorInvalidValue past 6.
template <class F>
cudaError_t for_ntiles(const Int8AttnParams& p, F&& launch) {
  switch ((p.group * p.max_q + 7) / 8) {
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    case 3: return launch(std::integral_constant<int, 3>{});
    case 4: return launch(std::integral_constant<int, 4>{});
    case 5: return launch(std::integral_constant<int, 5>{});
    case 6: return launch(std::integral_constant<int, 6>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace attn
}  // namespace vllm_prism
