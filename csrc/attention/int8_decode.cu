// Split-KV decode attention over the paged INT8 cache on the fp16 tensor cores
// (int8_attention.cuh has the data layout and the parameters).
//
// One CTA = one (request, segment), 4 x SPLIT warps. A stage holds 64 (slot, KV head) rows: 16
// slots of every KV head (4 heads), or 2 x 16 slots of 2 heads, or 4 x 16 slots of one head;
// (tile, head) pair tw = w % 4 of warp w takes head tw % heads of sub-tile tw / heads. With
// SPLIT = 2 two warps share a pair, warp w / 4 taking half of the head dimension in both
// products: their halves of S^T meet through shared memory (one 64-thread barrier a stage),
// both run the same softmax, each accumulates its half of O^T. That doubles the warps a
// multiprocessor holds for the same shared memory (16 at head size 256, against 8 at 12 %
// occupancy): 1.14x at 4K, 1.01-1.03x at 32K-128K on the H200, where a call's fixed cost
// (the merge, the partials, the fill and drain) bounds it (attention_h200_notes.md). Per warp
// and 16-slot tile, with the tile's slots as the MMA's M rows and the query heads of the GQA
// group (<= 8, zero padded) as its N columns:
//
//   S^T [16 slots x 8 heads] = K [16 x hd] . Q^T          (A = K rows, fp16 from int8 bits)
//   O^T [hd x 8 heads]      += V^T [hd x 16 slots] . P^T  (A = V columns, B = P^T)
//
// K rows go straight into the A operand: the dot product's dimension order is free, so each
// thread reads 8 consecutive bytes of a row (two k-steps) and Q's B operand uses the same
// order. S^T's accumulator fragment becomes P^T's B operand by one `movmatrix.trans` per 8 rows.
// V^T's A operand needs 2 slots of one dimension per register: each thread reads one 4-byte
// word from 4 slots and byte-transposes them with `prmt`. int8 -> fp16 is exact from the bits:
// (v ^ 0x80) as the low byte under 0x64 is the fp16 1152 + v; one f16x2 subtraction leaves v.
//
// Scales: S = (K_int8 . Q) * k_scale[slot] (the softmax scale and log2(e) are folded into Q);
// P^T carries v_scale[slot] / max(v_scale of the tile), so its fp16 values lie in [0, 1]; the
// accumulator is kept in units of the current tile's max scale and rescaled with the softmax's
// alpha. Slot rows map to slots by a fixed permutation (`slot_of_row`) chosen so that every
// shared-memory read of K (8 bytes a lane) and V (4 bytes) is free of bank conflicts.
//
// The segment's partial output (fp32, normalised) and its log2-sum-exp go to part_o / part_lse
// for the merge kernel (vllm_prism/attention/ops/triton_split_kv.py), or, with one segment,
// the output itself.
//
// Copies (p.bulk): 0, every thread's 16-byte cp.async over the stage (2,080 of them for a
// 33 KB tile at head size 256 and 4 KV heads: 16 a thread), waited with cp.async.wait_group;
// 1 (sm_90+), thread 0 copies each 16-slot tile as one request to the bulk-copy engine (the
// tile's slots are one contiguous run in the NHD layout), counted on the stage's mbarrier,
// which every thread waits on. The stage loop's barrier still orders a buffer's reuse.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "../async_pipeline.cuh"
#include "attn_trace.cuh"
#include "int8_attention.cuh"
#include "int8_tile.cuh"

namespace vllm_prism {
namespace {

using namespace attn;

constexpr int kSlots = kTileSlots;  // slots of a tile (the MMA's M)
constexpr int kTileWarps = 4;  // (tile, head) pairs a stage holds: one per warp, or per warp pair
constexpr int kHeads = 8;  // the MMA's N: query heads of a group, zero padded
// The bulk-copy path's pieces (sm_90+; the host launches p.bulk only there): each traps below
// sm_90, so a launch that reached them there would fail by name instead of reading stale tiles.
__device__ __forceinline__ void stage_bars_init(uint64_t* bars, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int i = 0; i < n; ++i) mbar_init(bars + i, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void stage_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mbar_expect_tx(bar, bytes);
#else
  __trap();
#endif
}
__device__ __forceinline__ void tile_bulk_copy(void* dst, const void* src, uint32_t bytes,
                                               uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  bulk_copy(dst, src, bytes, bar);
#else
  __trap();
#endif
}
__device__ __forceinline__ void stage_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mbar_wait(bar, parity);
#else
  __trap();
#endif
}

// The CTA's timeline for benchmarks/kernels/decode_trace.cu (attn_trace.cuh: compiled in only
// there), thread 0's, kTraceStride words: 0 kernel entry, 1 its %globaltimer (ns), 2 the
// prologue's copies issued (after the grid-dependency wait), 3 the stage loop done, 4 the
// output written, 5 its %globaltimer, 6 the multiprocessor (%smid), 7 the warps' results in
// shared memory (the end's merge: 3 to 7, its writes: 7 to 4; where a stage holds one tile,
// the writes from registers begin at 7); kTraceIter + 2 it (+ 1)
// iteration it waits for its stage (its stage is in and the next one's copies issued).
constexpr int kTraceMaxIters = 128;
constexpr int kTraceIter = 8;
constexpr int kTraceStride = kTraceIter + 2 * kTraceMaxIters;

__device__ __forceinline__ void trace_at(int slot, bool timer = false) {
  attn_trace::at<kTraceStride>(threadIdx.x == 0, slot, timer);
}

template <int HD, int NKV, int SPLIT>
struct Shape {
  static constexpr int kWarps = kTileWarps * SPLIT;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRow = 2 * HD + 8;  // bytes of one (slot, head) row
  static constexpr int kSlotBytes = NKV * kRow;
  static constexpr int kSubBytes = kSlots * kSlotBytes;  // one 16-slot tile, every head
  static constexpr int kSubs = kTileWarps / NKV;  // tiles a stage holds
  static constexpr int kStageBytes = kSubs * kSubBytes;  // = 64 rows
  static constexpr int kStages = HD >= 256 ? 3 : 4;
  // SPLIT = 2: each warp's partial S^T (4 floats a lane) for its partner, after the stages
  static constexpr int kXchgBytes = SPLIT > 1 ? kWarps * 32 * 16 : 0;
  static constexpr int kBarOffset = kStages * kStageBytes + kXchgBytes;  // 8-byte aligned
  static constexpr int kSmem = kBarOffset + kStages * 8;  // + a stage's mbarrier (p.bulk)
  static constexpr int kFinalBytes = kTileWarps * (kHeads * HD + 2 * kHeads) * 4;
  static_assert(kFinalBytes <= kStages * kStageBytes,
                "the merge of the warps reuses the stage buffers");
  static_assert(kSubBytes % 16 == 0, "16-byte copies");
  static_assert(SPLIT == 1 || SPLIT == 2, "one warp a (tile, head) or two");
};

template <int HD, int NKV, int SPLIT>
__global__ void __launch_bounds__(Shape<HD, NKV, SPLIT>::kThreads, SPLIT > 1 ? 2 : 1)
    int8_decode_kernel(const Int8AttnParams p) {
  using S = Shape<HD, NKV, SPLIT>;
  constexpr int kThreads = S::kThreads;
  constexpr int KSTEPS2 = HD / 32;  // pairs of k-steps (QK) = word groups (PV)
  constexpr int KH = KSTEPS2 / SPLIT;  // those of one warp: its part of the head dimension
  constexpr int MT = HD / 16 / SPLIT;  // O^T accumulator tiles of one warp
  extern __shared__ __align__(16) uint8_t smem[];

  const int sel = blockIdx.x;
  const int seg = blockIdx.y;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int tw = SPLIT > 1 ? warp % kTileWarps : warp;  // the (tile, head) of the stage
  const int half = SPLIT > 1 ? warp / kTileWarps : 0;  // its part of the head dimension
  const int kk0 = half * KH;  // first k-step pair / word group of this warp
  const int head = tw % NKV;
  const int sub = tw / NKV;

  const int req = p.req_ids != nullptr ? p.req_ids[sel] : sel;
  const int q_row = p.qsl[req];
  const int seq_len = p.seq_lens[req];
  const int n_tiles = (seq_len + kSlots - 1) / kSlots;
  const int tps = max((n_tiles + p.num_segs - 1) / p.num_segs, p.min_tiles);
  const int t0 = seg * tps;
  const int t1 = min(t0 + tps, n_tiles);
  const int n_iter = t1 > t0 ? (t1 - t0 + S::kSubs - 1) / S::kSubs : 0;
  const int32_t* bt = p.block_table + static_cast<int64_t>(req) * p.stride_bt;
  const uint8_t* cache = reinterpret_cast<const uint8_t*>(p.cache);

  trace_at(0);
  trace_at(1, true);
  attn_trace::sm_at<kTraceStride>(threadIdx.x == 0, 6);
  const bool bulk = p.bulk != 0;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kBarOffset);
  auto tile_src = [&](int tile) {
    const int pos0 = tile * kSlots;
    const int blk = bt[pos0 / p.block_size];
    return cache + static_cast<int64_t>(blk) * p.stride_cb +
           static_cast<int64_t>(pos0 % p.block_size) * p.stride_cn;
  };
  // Stage `it`'s copies: every thread's share (cp.async), or thread 0's bulk requests.
  auto issue = [&](int it) {
    uint8_t* dst = smem + (it % S::kStages) * S::kStageBytes;
    if (bulk) {
      if (threadIdx.x != 0) return;
      const int n = min(S::kSubs, t1 - (t0 + it * S::kSubs));
      uint64_t* bar = bars + it % S::kStages;
      stage_expect(bar, static_cast<uint32_t>(n * S::kSubBytes));
      for (int s = 0; s < n; ++s)
        tile_bulk_copy(dst + s * S::kSubBytes, tile_src(t0 + it * S::kSubs + s), S::kSubBytes,
                       bar);
      return;
    }
#pragma unroll
    for (int s = 0; s < S::kSubs; ++s) {
      const int tile = t0 + it * S::kSubs + s;
      if (tile < t1) {
        const uint8_t* src = tile_src(tile);
        const uint32_t d = smem_addr(dst + s * S::kSubBytes);
        for (int c = threadIdx.x; c < S::kSubBytes / 16; c += kThreads)
          cp_async16(d + c * 16, src + c * 16);
      }
    }
  };
  if (bulk && threadIdx.x == 0) stage_bars_init(bars, S::kStages);

  // Start the copies before anything else. With PDL, the stages of tiles wholly before the
  // step's token (position seq_len - 1: earlier steps wrote them) start while the kernel
  // before this one finishes; everything this step wrote or allocated is read after the wait.
  const int old_tiles = (seq_len - 1) / kSlots;
  int early = 0;
  if (p.pdl) {
    while (early < S::kStages - 1 && early < n_iter &&
           min(t0 + (early + 1) * S::kSubs, t1) <= old_tiles)
      ++early;
  }
  for (int s = 0; s < early; ++s) {
    issue(s);
    cp_async_commit();
  }
  pdl_trigger(p.pdl, 1);
  pdl_wait();
  for (int s = early; s < S::kStages - 1; ++s) {
    if (s < n_iter) issue(s);
    cp_async_commit();
  }
  trace_at(2);

  // Q as the B operand of S^T = K . Q^T: k-step 2 * kk + e of thread (g, t) covers the query
  // dimensions 32 kk + 8 t + 4 e + 0..3 of head g.
  uint32_t qf[KH][4];
  {
    const int hq = head * p.group + g;
    if (g < p.group) {
      const int64_t elem = static_cast<int64_t>(q_row) * p.stride_qt +
                           static_cast<int64_t>(hq) * p.stride_qh;
      const uint8_t* qp = reinterpret_cast<const uint8_t*>(p.q) + elem * 2;
#pragma unroll
      for (int kk = 0; kk < KH; ++kk) load_q8(qp + (32 * (kk0 + kk) + 8 * t) * 2, p.q_dtype,
                                               p.qk_scale, qf[kk]);
    } else {
#pragma unroll
      for (int kk = 0; kk < KH; ++kk) qf[kk][0] = qf[kk][1] = qf[kk][2] = qf[kk][3] = 0u;
    }
  }

  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  float cur_vmax = 1.f;

  const int rg = slot_of_row(g);  // S^T rows g and g + 8
  const int rg8 = rg + 8;
  const int r0 = slot_of_row(2 * t);  // P^T / V^T k rows 2t, 2t+1, 2t+8, 2t+9
  const int r1 = slot_of_row(2 * t + 1);
  const int r2 = r0 + 8;
  const int r3 = r1 + 8;

  for (int it = 0; it < n_iter; ++it) {
    trace_at(kTraceIter + 2 * it);  // past kTraceMaxIters: beyond the stride, dropped
    if (bulk) {
      // every warp is past stage it - 1, whose buffer the next issue fills (the barriers'
      // init, thread 0's, is seen by all after the first pass)
      __syncthreads();
      if (it + S::kStages - 1 < n_iter) issue(it + S::kStages - 1);
      stage_wait(bars + it % S::kStages, (it / S::kStages) & 1);
    } else {
      cp_async_wait<S::kStages - 2>();
      __syncthreads();
      if (it + S::kStages - 1 < n_iter) issue(it + S::kStages - 1);
      cp_async_commit();
    }
    trace_at(kTraceIter + 2 * it + 1);

    const int tile = t0 + it * S::kSubs + sub;
    if (tile >= t1) continue;
    const uint8_t* base = smem + (it % S::kStages) * S::kStageBytes + sub * S::kSubBytes +
                          head * S::kRow;
    const uint8_t* row_g = base + rg * S::kSlotBytes;
    const uint8_t* row_g8 = base + rg8 * S::kSlotBytes;

    // ---- S^T = K . Q^T (SPLIT = 2: each warp of the pair over its half of the dimensions)
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int kk = 0; kk < KH; ++kk) {
      const uint2 ka = *reinterpret_cast<const uint2*>(row_g + 32 * (kk0 + kk) + 8 * t);
      const uint2 kb = *reinterpret_cast<const uint2*>(row_g8 + 32 * (kk0 + kk) + 8 * t);
      const uint32_t xa = ka.x ^ kSignFlip, xb = kb.x ^ kSignFlip;
      mma16816(s, f16x2_of(xa, 0x4140), f16x2_of(xb, 0x4140), f16x2_of(xa, 0x4342),
               f16x2_of(xb, 0x4342), qf[kk][0], qf[kk][1]);
      const uint32_t ya = ka.y ^ kSignFlip, yb = kb.y ^ kSignFlip;
      mma16816(s, f16x2_of(ya, 0x4140), f16x2_of(yb, 0x4140), f16x2_of(ya, 0x4342),
               f16x2_of(yb, 0x4342), qf[kk][2], qf[kk][3]);
    }
    if constexpr (SPLIT > 1) {
      // The pair's two halves: x + y in both warps (addition commutes, so both hold the same
      // bits and run the same softmax). The next stage's top barrier orders the reuse.
      float4* xs = reinterpret_cast<float4*>(smem + S::kStages * S::kStageBytes);
      xs[warp * 32 + lane] = make_float4(s[0], s[1], s[2], s[3]);
      pair_sync(tw);
      const float4 o = xs[(warp ^ kTileWarps) * 32 + lane];
      s[0] += o.x;
      s[1] += o.y;
      s[2] += o.z;
      s[3] += o.w;
    }

    // ---- online softmax over the tile (columns: heads 2t, 2t+1)
    const float ks_g = ld_f32(row_g + HD), ks_g8 = ld_f32(row_g8 + HD);
    float vs_g = ld_f32(row_g + 2 * HD + 4), vs_g8 = ld_f32(row_g8 + 2 * HD + 4);
    float s0 = s[0] * ks_g, s1 = s[1] * ks_g, s2 = s[2] * ks_g8, s3 = s[3] * ks_g8;
    const int pos0 = tile * kSlots;
    if (pos0 + kSlots > seq_len) {  // the last, partial tile: slots past the end hold garbage
      if (pos0 + rg >= seq_len) {
        s0 = s1 = -INFINITY;
        vs_g = 0.f;
      }
      if (pos0 + rg8 >= seq_len) {
        s2 = s3 = -INFINITY;
        vs_g8 = 0.f;
      }
    }
    float mx0 = fmaxf(s0, s2), mx1 = fmaxf(s1, s3), vmax = fmaxf(vs_g, vs_g8);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, o));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);  // finite: a tile has a valid slot
    const float a0 = exp2f(m0 - mn0), a1 = exp2f(m1 - mn1);
    const float p0 = exp2f(s0 - mn0), p1 = exp2f(s1 - mn1);
    const float p2 = exp2f(s2 - mn0), p3 = exp2f(s3 - mn1);
    l0 = l0 * a0 + p0 + p2;
    l1 = l1 * a1 + p1 + p3;
    m0 = mn0;
    m1 = mn1;
    const float inv_vmax = 1.f / vmax;
    const float f0 = a0 * cur_vmax * inv_vmax, f1 = a1 * cur_vmax * inv_vmax;
    cur_vmax = vmax;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      acc[i][0] *= f0;
      acc[i][1] *= f1;
      acc[i][2] *= f0;
      acc[i][3] *= f1;
    }
    const float wg = vs_g * inv_vmax, wg8 = vs_g8 * inv_vmax;
    const uint32_t b0 = transpose8x8(pack_f16x2(p0 * wg, p1 * wg));
    const uint32_t b1 = transpose8x8(pack_f16x2(p2 * wg8, p3 * wg8));

    // ---- O^T += V^T . P^T: word c = 8 pp + g of slots r0..r3 -> dims 4c..4c+3 (this warp's
    // word groups kk0 .. kk0 + KH - 1)
    const uint8_t* v0 = base + r0 * S::kSlotBytes + HD + 4;
    const uint8_t* v1 = base + r1 * S::kSlotBytes + HD + 4;
    const uint8_t* v2 = base + r2 * S::kSlotBytes + HD + 4;
    const uint8_t* v3 = base + r3 * S::kSlotBytes + HD + 4;
#pragma unroll
    for (int pp = 0; pp < KH; ++pp) {
      const int off = 4 * (8 * (kk0 + pp) + g);
      const uint32_t w0 = ld_u32(v0 + off) ^ kSignFlip, w1 = ld_u32(v1 + off) ^ kSignFlip;
      const uint32_t w2 = ld_u32(v2 + off) ^ kSignFlip, w3 = ld_u32(v3 + off) ^ kSignFlip;
      const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
      const uint32_t lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
      mma16816(acc[2 * pp], f16x2_of(lo01, 0x4140), f16x2_of(lo01, 0x4342),
               f16x2_of(lo23, 0x4140), f16x2_of(lo23, 0x4342), b0, b1);
      mma16816(acc[2 * pp + 1], f16x2_of(hi01, 0x4140), f16x2_of(hi01, 0x4342),
               f16x2_of(hi23, 0x4140), f16x2_of(hi23, 0x4342), b0, b1);
    }
  }

  pdl_trigger(p.pdl, 2);
  trace_at(3);

  // ---- merge the warps of a head (sub-tiles) and write
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  // The (query head hq, dimensions d .. d + 3) result o, the sum lsum of its weights at the
  // maximum mmax: the output where one segment covers the context, else the segment's partial
  // and (once a pair, d == 0) its log-sum-exp.
  const bool direct = p.num_segs == 1;
  auto emit = [&](int hq, int d, const float (&o)[4], float lsum, float mmax) {
    if (direct) {
      uint8_t* op = reinterpret_cast<uint8_t*>(p.out) +
                    (static_cast<int64_t>(q_row) * p.stride_ot +
                     static_cast<int64_t>(hq) * p.stride_oh + d) * 2;
      store_out(op, p.out_dtype, o);
      return;
    }
    if (lsum > 0.f) {
      store_partial(p.part_o, p.part_dtype,
                    sel * p.stride_pr + hq * p.stride_ph + seg * p.stride_ps + d, o);
    }
    if (d == 0)
      p.part_lse[sel * p.stride_lr + hq * p.stride_lh + seg] =
          lsum > 0.f ? mmax + log2f(lsum) : -INFINITY;
  };
  if constexpr (S::kSubs == 1) {
    // A stage holds one tile: a warp (pair) has its head's whole result in registers, and
    // thread (g, t) writes columns 2t and 2t + 1 (query heads of the group), dimensions
    // 4c .. 4c + 3 of its words c = 8 pp + g, straight from them. The same products and
    // quotient as the merge through shared memory below, which would weigh a lone tile by
    // exp2(0) = 1; no CTA barrier, no shared-memory round trip.
    trace_at(7);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int j = 2 * t + e;
      if (j >= p.group) continue;
      const float mmax = e ? m1 : m0;
      const bool live = mmax != -INFINITY;  // not a segment without tiles
      const float lsum = live ? (e ? l1 : l0) : 0.f;
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
      for (int pp = 0; pp < KH; ++pp) {
        float o[4] = {0.f, 0.f, 0.f, 0.f};
        if (live) {
          o[0] = acc[2 * pp][e] * cur_vmax;
          o[1] = acc[2 * pp][e + 2] * cur_vmax;
          o[2] = acc[2 * pp + 1][e] * cur_vmax;
          o[3] = acc[2 * pp + 1][e + 2] * cur_vmax;
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) o[k] *= inv;
        emit(head * p.group + j, 4 * (8 * (kk0 + pp) + g), o, lsum, mmax);
      }
    }
    trace_at(4);
    trace_at(5, true);
    return;
  }
  cp_async_wait<0>();
  __syncthreads();
  float* fin = reinterpret_cast<float*>(smem);
  float* facc = fin + tw * kHeads * HD;  // [8 heads][HD], true units (a pair: its halves)
  float* fml = fin + kTileWarps * kHeads * HD + tw * 2 * kHeads;  // m[8], l[8]
#pragma unroll
  for (int pp = 0; pp < KH; ++pp) {
    const int d = 4 * (8 * (kk0 + pp) + g);
    const float4 h0 = make_float4(acc[2 * pp][0] * cur_vmax, acc[2 * pp][2] * cur_vmax,
                                  acc[2 * pp + 1][0] * cur_vmax, acc[2 * pp + 1][2] * cur_vmax);
    const float4 h1 = make_float4(acc[2 * pp][1] * cur_vmax, acc[2 * pp][3] * cur_vmax,
                                  acc[2 * pp + 1][1] * cur_vmax, acc[2 * pp + 1][3] * cur_vmax);
    *reinterpret_cast<float4*>(facc + (2 * t) * HD + d) = h0;
    *reinterpret_cast<float4*>(facc + (2 * t + 1) * HD + d) = h1;
  }
  if (g == 0 && half == 0) {
    fml[2 * t] = m0;
    fml[2 * t + 1] = m1;
    fml[kHeads + 2 * t] = l0;
    fml[kHeads + 2 * t + 1] = l1;
  }
  __syncthreads();
  trace_at(7);

  // The output: thread x takes dimensions d .. d + 3 of the (KV head h, query j) pairs
  // hq = h group + j = x / kPerHead, + kStep, ... (the order of a loop over HD / 4 pieces a
  // pair), walking h and j without dividing by the group, a runtime value: the loop's two
  // integer divisions a pass were a tenth of the decode kernel's stall samples at 32K, 12
  // passes a thread (Nsight Compute, H100, 2026-12-07).
  constexpr int kPerHead = HD / 4;
  static_assert(kThreads % kPerHead == 0, "a thread keeps its dimensions");
  constexpr int kStep = kThreads / kPerHead;
  const int d = (threadIdx.x % kPerHead) * 4;
  const int pairs = NKV * p.group;
  int h = 0, j = threadIdx.x / kPerHead;
  auto carry = [&] {  // j back below the group, h up by as many groups
    while (j >= p.group) {
      j -= p.group;
      ++h;
    }
  };
  carry();
  for (int hq = threadIdx.x / kPerHead; hq < pairs; hq += kStep) {
    float mmax = -INFINITY;
#pragma unroll
    for (int s = 0; s < S::kSubs; ++s)
      mmax = fmaxf(mmax, fin[kTileWarps * kHeads * HD + (s * NKV + h) * 2 * kHeads + j]);
    float lsum = 0.f;
    float o[4] = {0.f, 0.f, 0.f, 0.f};
    if (mmax != -INFINITY) {
#pragma unroll
      for (int s = 0; s < S::kSubs; ++s) {
        const int w = s * NKV + h;
        const float* ml = fin + kTileWarps * kHeads * HD + w * 2 * kHeads;
        const float wgt = exp2f(ml[j] - mmax);
        lsum += ml[kHeads + j] * wgt;
        const float4 a = *reinterpret_cast<const float4*>(fin + w * kHeads * HD + j * HD + d);
        o[0] += a.x * wgt;
        o[1] += a.y * wgt;
        o[2] += a.z * wgt;
        o[3] += a.w * wgt;
      }
    }
    const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] *= inv;
    emit(hq, d, o, lsum, mmax);
    j += kStep;
    carry();
  }
  trace_at(4);
  trace_at(5, true);
}

template <int HD, int NKV, int SPLIT>
cudaError_t launch(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  using S = Shape<HD, NKV, SPLIT>;
  static const cudaError_t attr = cudaFuncSetAttribute(
      int8_decode_kernel<HD, NKV, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem);
  if (attr != cudaSuccess) return attr;
  return launch_kernel(int8_decode_kernel<HD, NKV, SPLIT>, dim3(num_selected, p.num_segs),
                       S::kThreads, S::kSmem, stream, p, p);
}

template <int HD, int SPLIT>
cudaError_t launch_nkv(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  switch (p.num_kv_heads) {
    case 1: return launch<HD, 1, SPLIT>(p, num_selected, stream);
    case 2: return launch<HD, 2, SPLIT>(p, num_selected, stream);
    case 4: return launch<HD, 4, SPLIT>(p, num_selected, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <int HD>
cudaError_t launch_hd(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  return p.dim_split == 2 ? launch_nkv<HD, 2>(p, num_selected, stream)
                          : launch_nkv<HD, 1>(p, num_selected, stream);
}

}  // namespace

bool int8_decode_supported(int head_dim, int num_kv_heads) {
  return attn::head_dim_compiled(head_dim) &&
         (num_kv_heads == 1 || num_kv_heads == 2 || num_kv_heads == 4);
}

cudaError_t int8_decode_launch(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  if (num_selected <= 0 || p.num_segs <= 0) return cudaSuccess;
  if (p.group < 1 || p.group > kInt8DecodeMaxGroup || p.block_size % kSlots != 0 ||
      (p.dim_split != 1 && p.dim_split != 2))
    return cudaErrorInvalidValue;
  return attn::for_head_dim(p.head_dim, [&](auto hd) {
    return launch_hd<decltype(hd)::value>(p, num_selected, stream);
  });
}

}  // namespace vllm_prism
