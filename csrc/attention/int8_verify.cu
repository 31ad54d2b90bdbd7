// Split-KV verification attention over the paged INT8 cache on the fp16 tensor cores
// (int8_attention.cuh has the parameters). The tile algebra is the decode kernel's
// (int8_decode.cu): with the slots as the MMA's M rows and the columns (query token x GQA
// head, column = token x group + head) as its N,
//
//   S^T [16 slots x 8 columns] = K . Q^T
//   O^T [hd x 8 columns]      += V^T . P^T
//
// One CTA = one (request, KV head, segment); a stage is T 16-slot tiles of the head's rows
// (T = 4; 2 at head size 64). Each int8 V element becomes an fp16 operand once in the CTA, each
// K element once or twice: warp w owns S^T of tile w % T for the n-tiles of its column half
// w / T (two halves, 8 warps, at head size 256 with two or more n-tiles; one half, T warps,
// otherwise). With two halves and up to 4 n-tiles (dim_split 2) the pair of warps of a tile
// splits the head dimension instead of the columns for the MMAs (warp w converts the K bytes
// of its half and runs its k-steps for every n-tile), then hands its partner the partial sums
// of the partner's columns through shared memory (a named barrier a pair): each K element is
// converted once and both warps run the same MMAs, where each pair converted every K element
// twice (attention_h200_notes.md: 3-4 % faster at 4 query tokens x 6 heads). At 5 n-tiles
// the split form spills in its 128 registers and measured 3-6 % slower, at 6 its 12 KB
// exchange would leave one CTA a multiprocessor: there each warp runs the full head
// dimension for its half's n-tiles.
// The tiles' column maxima meet in shared memory (one barrier); each warp writes
// its P^T (fp16, scaled by v_scale / the running maximum of the V scales) to shared memory and
// the column's first tile its accumulator factor (the softmax's alpha times the V-scale
// ratio); after a second barrier warp w runs O^T += V^T . P^T for its HD / warps dimensions
// over the whole stage, the P^T operands read with ldmatrix, the accumulator rescaled by those
// factors. The row sums are kept per thread and added up at the end.
//
// Lazy maxima (LM, p.lazy_max, exact Q.K): from a segment's second stage on, each warp first
// builds its P^T against its columns' running maxima and the running V-scale maximum as they
// stand (no tile maxima, no stage V-scale maximum) and checks its own values against them: a
// score more than kLazyHeadroom (log2) above its column's maximum, a column without one yet, or
// a V scale more than kLazyVScaleHeadroom (64) times the running maximum is out of bounds.
// One barrier that ORs the verdicts (bar.red.or) then publishes P^T: none out of bounds, and
// O^T += V^T . P^T follows at once with nothing rescaled (P <= 2^14 in fp16); any, and every
// warp redoes the stage the exact way above. Two barriers a stage instead of three while the
// maxima hold (0.89-0.97x the time at 128K on the H200, attention_h200_notes.md).
//
// The head's rows (2 hd + 8 bytes) go into shared memory rows padded to a stride of 8 words mod
// 32 by cp.async, two stages (the next one copied while the current one is computed): with
// 16-byte aligned cache blocks and slots (vLLM's NHD layout) in 16-byte pieces and one 8-byte
// piece (a row then starts 8 bytes into its shared row where the head's offset is 8 mod 16),
// in any other layout in 8-byte pieces. The decode kernel's bank-conflict-free slot order
// applies. Prefix and causal tail run in one pass: column (token t, head j) sees positions
// <= prefix + t. A segment covers a multiple of T tiles.
//
// Integer Q.K (IQK, opt-in: p.int_qk): each column of Q is quantised to int8 (absmax / 127 of
// the scaled query, rounded to nearest) into shared memory with its scale, and S^T = K . Q^T
// runs on the int8 tensor cores (m16n8k32) straight from the cache's int8 bytes: the K
// operand is the shared row's 8 bytes a lane as they are (its k order is the query's), never
// converted; the int32 scores are scaled by the column's query scale and the slot's K scale.
// P^T and O^T as above.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "int8_attention.cuh"
#include "int8_tile.cuh"
#include "int8_verify_common.cuh"

namespace vllm_prism {
namespace {

using namespace attn;

constexpr int kSlots = kTileSlots;

template <int HD, int NT, bool IQK = false, bool DS = true>
struct VShape {
  static constexpr int kTiles = HD >= 128 ? 4 : 2;  // 16-slot tiles a stage
  // column halves: at head size 256 two warps share a tile's S^T (each its half of the
  // n-tiles), so a CTA has 8 warps of at most 128 registers
  static constexpr int kHalves = HD == 256 && NT >= 2 ? 2 : 1;
  static constexpr int kWarps = kTiles * kHalves;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kUnits = HD / 32 / kWarps;  // 32-dimension output units a warp
  static constexpr int kHalfNT = (NT + kHalves - 1) / kHalves;  // n-tiles of a half
  static constexpr int kCols = 8 * NT;
  static constexpr int kStageSlots = kSlots * kTiles;
  static constexpr int kRow = 2 * HD + 8;  // bytes of one (slot, head) row in the cache
  // shared-memory row stride: words = 8 mod 32 (conflict-free K and V reads), room for a row
  // that starts 8 bytes in
  static constexpr int kSRow = 4 * (((kRow / 4 - 8 + 31) / 32) * 32 + 8);
  static constexpr int kStageBytes = kStageSlots * kSRow;
  // query rows: fp16 (words = 16 mod 32), or int8 with IQK (words = 8 mod 32: a lane's 8-byte
  // loads of 8 columns conflict-free)
  static constexpr int kQRow = IQK ? 4 * (((HD / 4 - 8 + 31) / 32) * 32 + 8) : 2 * HD + 64;
  static constexpr int kPRow = 2 * kStageSlots + 16;  // fp16 P^T rows: 16-byte steps mod 128
  static constexpr int kQOff = 2 * kStageBytes;
  static constexpr int kQsOff = kQOff + kCols * kQRow;  // fp32 [column] query scales (IQK)
  static constexpr int kPOff = kQsOff + (IQK ? kCols * 4 : 0);
  static constexpr int kRedOff = kPOff + kCols * kPRow;  // fp32 [column][tile]
  static constexpr int kFacOff = kRedOff + kCols * kTiles * 4;  // fp32 [column]
  // The pair of warps of a tile splits S^T's head dimension (each converts half of the tile's
  // K once and runs its half of the k-steps for every n-tile), and each hands the other the
  // partial sums of the other's columns through shared memory ([tile][n-tile][lane][4]), up
  // to 4 n-tiles
  static constexpr bool kDimSplit = DS && kHalves == 2 && NT <= 4;
  static constexpr int kXchgOff = kFacOff + kCols * 4;
  static constexpr int kSmem = kXchgOff + (kDimSplit ? kTiles * NT * 32 * 16 : 0);
  // With 5 n-tiles the first column half has three, the second two: the second half's warps
  // alone copy the stages (at 3 n-tiles that was slower: the copies start later)
  static constexpr bool kCopyHalf1 = kHalves == 2 && NT == 5;
  static constexpr int kCopyThreads = kCopyHalf1 ? kThreads / 2 : kThreads;
  static constexpr int kTpr = kCopyThreads / kStageSlots;  // threads copying a row
  static_assert(kSRow >= kRow + 8 && (kSRow / 4) % 32 == 8 && kSRow % 16 == 0, "row layout");
  static_assert(kUnits >= 1 && HD == 32 * kWarps * kUnits, "dimension split");
  static_assert(kTpr * kStageSlots == kCopyThreads, "threads a row");
  static_assert(!IQK || ((kQRow / 4) % 32 == 8 && kQRow >= HD), "int8 query rows");
  static_assert(!IQK || (kCols * (HD / 8)) % 32 == 0, "whole warps quantise the query");
};

// The column maximum over the stage's tiles (red: [column][tile]).
template <int T>
__device__ __forceinline__ float stage_max(const float* red, int col) {
  if constexpr (T == 4) {
    const float4 v = *reinterpret_cast<const float4*>(red + 4 * col);
    return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
  } else {
    const float2 v = *reinterpret_cast<const float2*>(red + 2 * col);
    return fmaxf(v.x, v.y);
  }
}

template <int T>
__device__ __forceinline__ float stage_sum(const float* red, int col) {
  if constexpr (T == 4) {
    const float4 v = *reinterpret_cast<const float4*>(red + 4 * col);
    return (v.x + v.y) + (v.z + v.w);
  } else {
    const float2 v = *reinterpret_cast<const float2*>(red + 2 * col);
    return v.x + v.y;
  }
}

// Runs f(std::integral_constant<int, h>{}) for the column half h of warp `warp` (T warps a
// half), so that f indexes its registers by compile-time n-tiles.
template <int T, int HALVES, class F>
__device__ __forceinline__ void with_half(int warp, F&& f) {
  if constexpr (HALVES == 1) {
    f(std::integral_constant<int, 0>{});
  } else {
    if (warp < T) f(std::integral_constant<int, 0>{});
    else f(std::integral_constant<int, 1>{});
  }
}

// Calls f(n, e, col) for each column col = 8 (N0 + n) + 2t + e that lane t holds in the
// n-tiles N0 .. of its warp's column half (n counted within the half: a compile-time index
// once unrolled).
template <int T, int HALVES, int NT, class F>
__device__ __forceinline__ void for_half_columns(int warp, int t, F&& f) {
  constexpr int NH = (NT + HALVES - 1) / HALVES;
  with_half<T, HALVES>(warp, [&](auto half) {
    constexpr int N0 = decltype(half)::value * NH;
    constexpr int NN = NT - N0 < NH ? NT - N0 : NH;
#pragma unroll
    for (int n = 0; n < NN; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) f(n, e, 8 * (N0 + n) + 2 * t + e);
    }
  });
}

// Q into shared memory: column c = token * group + head of the group (zero past the request's
// columns), fp16 rows scaled by qk_scale, or (IQK) int8 rows of the scaled query with the
// column's scale (absmax / 127) in qsc; read after the main loop's first barrier.
template <int HD, int NT, bool IQK>
__device__ __forceinline__ void stage_query(const Int8AttnParams& p, int kvh, int q_start,
                                            int n_cols, uint8_t* qs, float* qsc) {
  using S = VShape<HD, NT, IQK>;
  constexpr int kChunks = HD / 8;  // 8 values a thread; a column's chunks share a warp
  for (int i = threadIdx.x; i < S::kCols * kChunks; i += S::kThreads) {
    const int c = i / kChunks;
    const int d = (i - c * kChunks) * 8;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (c < n_cols) {
      const int tq = c / p.group;
      const int hq = kvh * p.group + (c - tq * p.group);
      const int64_t elem = static_cast<int64_t>(q_start + tq) * p.stride_qt +
                           static_cast<int64_t>(hq) * p.stride_qh + d;
      load_q8_f32(reinterpret_cast<const uint8_t*>(p.q) + elem * 2, p.q_dtype, p.qk_scale, v);
    }
    if constexpr (IQK) {
      float amax = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
      for (int o = 1; o < kChunks; o <<= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      *reinterpret_cast<uint2*>(qs + c * S::kQRow + d) =
          make_uint2(pack_s8x4(v[0] * inv, v[1] * inv, v[2] * inv, v[3] * inv),
                     pack_s8x4(v[4] * inv, v[5] * inv, v[6] * inv, v[7] * inv));
      if (d == 0) qsc[c] = amax * (1.f / 127.f);
    } else {
      *reinterpret_cast<uint4*>(qs + c * S::kQRow + d * 2) =
          make_uint4(pack_f16x2(v[0], v[1]), pack_f16x2(v[2], v[3]), pack_f16x2(v[4], v[5]),
                     pack_f16x2(v[6], v[7]));
    }
  }
}

template <int HD, int NT, bool IQK, bool DS, bool LM>
__global__ void __launch_bounds__(VShape<HD, NT, IQK, DS>::kThreads, 2)
    int8_verify_kernel(const Int8AttnParams p) {
  using S = VShape<HD, NT, IQK, DS>;
  constexpr int T = S::kTiles;
  constexpr int U = S::kUnits;
  constexpr int NH = S::kHalfNT;
  constexpr int KSTEPS2 = HD / 32;  // pairs of k-steps (QK)
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* qs = smem + S::kQOff;
  float* qsc = reinterpret_cast<float*>(smem + S::kQsOff);
  uint8_t* ps = smem + S::kPOff;
  float* red = reinterpret_cast<float*>(smem + S::kRedOff);
  float* fac = reinterpret_cast<float*>(smem + S::kFacOff);

  const int sel = blockIdx.x;
  const int kvh = blockIdx.y;
  const int seg = blockIdx.z;
  const int warp = threadIdx.x >> 5;
  const int tile = warp % T;  // the warp's tile of a stage (S^T); warp / T: its column half
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  VerifyWork w;
  if (!w.init<T>(p, sel, kvh, seg)) return;
  const bool vec16 = verify_vec16(p);
  const int shift = verify_shift(p, kvh, vec16);

  // stage `st`: kTpr threads a row (the copying threads: S::kCopyThreads, the last ones)
  auto issue = [&](int st) {
    const int ct = static_cast<int>(threadIdx.x) - (S::kCopyHalf1 ? S::kCopyThreads : 0);
    if (ct < 0) return;
    copy_stage_rows<HD, T, S::kTpr, S::kSRow>(p, w, vec16, shift, st, ct,
                                              smem + (st & 1) * S::kStageBytes);
  };
  start_first_stage<T>(p, w, issue);

  stage_query<HD, NT, IQK>(p, kvh, w.q_start, w.n_cols, qs, qsc);

  // the fp16 filler 0x64 in every byte, in a register the compiler cannot fold (head_dim <
  // 65536): see f16x2_sel
  const uint32_t k64 = 0x64646464u | (static_cast<uint32_t>(p.head_dim) >> 16);
  float acc[2 * U][NT][4];  // O^T: this warp's dimensions, every column
#pragma unroll
  for (int i = 0; i < 2 * U; ++i)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.f;
  float m[NH][2];  // running maxima of the columns of this warp's half
  float l[NH][2];  // this thread's share of the row sums of its half's columns
#pragma unroll
  for (int n = 0; n < NH; ++n) m[n][0] = m[n][1] = -INFINITY;
#pragma unroll
  for (int n = 0; n < NH; ++n) l[n][0] = l[n][1] = 0.f;
  float run_vmax = 1e-30f;  // running maximum of the V scales (positive: all-zero V is fine)

  const int rg = slot_of_row(g);  // S^T rows g and g + 8
  const int rg8 = rg + 8;
  const int r0 = slot_of_row(2 * t);  // P^T / V^T k rows 2t, 2t+1, 2t+8, 2t+9
  const int r1 = slot_of_row(2 * t + 1);
  const int r2 = r0 + 8;
  const int r3 = r1 + 8;
  // ldmatrix rows of P^T: lane l gives row l % 8 of matrix l / 8 (k rows 8 (l / 8) ..)
  const uint32_t p_lane = smem_addr(ps) + (lane & 7) * S::kPRow + ((lane >> 3) & 1) * 16;

  for (int st = 0; st < w.n_stages; ++st) {
    cp_async_wait<0>();
    __syncthreads();  // the stage is in; every warp is done with the previous one
    if (st + 1 < w.n_stages) issue(st + 1);
    cp_async_commit();

    const uint8_t* base = smem + (st & 1) * S::kStageBytes + shift;
    const int stage_pos = (w.t0 + st * T) * kSlots;

    // the stage's V-scale maximum, the same in every warp (LM: on the exact path only)
    StageVScale vs;
    auto stage_vmax = [&]() {
      vs = stage_vscale<HD, S::kSRow, S::kStageSlots>(base, stage_pos, w.seq_len, run_vmax);
    };
    if constexpr (!LM) stage_vmax();
    bool exact = true;  // LM: false where the stage took the lazy path

    // S^T of this warp's tile for the n-tiles N0 .. N0 + NN - 1 of its half, the tile's column
    // maxima through shared memory (one barrier), then their P^T to shared memory
    auto scores = [&](auto half) {
      constexpr int N0 = decltype(half)::value * NH;
      constexpr int NN = NT - N0 < NH ? NT - N0 : NH;
      const uint8_t* row_g = base + (tile * kSlots + rg) * S::kSRow;
      const uint8_t* row_g8 = base + (tile * kSlots + rg8) * S::kSRow;
      // Q.K over the k-steps [KB, KB + KC) for the n-tiles [NB, NB + NC) into sf / sn (n - NB)
      auto qk = [&](auto nb, auto nc, auto kb, auto kc, auto& sf, auto& sn) {
        constexpr int NB = decltype(nb)::value, NC = decltype(nc)::value;
        constexpr int KB = decltype(kb)::value, KC = decltype(kc)::value;
#pragma unroll
        for (int n = 0; n < NC; ++n) {
          sf[n][0] = sf[n][1] = sf[n][2] = sf[n][3] = 0.f;
          sn[n][0] = sn[n][1] = sn[n][2] = sn[n][3] = 0;
        }
#pragma unroll
        for (int kk = KB; kk < KB + KC; ++kk) {
          const uint2 ka = *reinterpret_cast<const uint2*>(row_g + 32 * kk + 8 * t);
          const uint2 kb2 = *reinterpret_cast<const uint2*>(row_g8 + 32 * kk + 8 * t);
          if constexpr (IQK) {
            // a lane's 8 bytes of rows g and g + 8 are its A fragment as they are: bytes 0..3
            // at k 4t.., 4..7 at k 16 + 4t.. (the query's columns stored in the same order)
#pragma unroll
            for (int n = 0; n < NC; ++n) {
              const uint2 qv = *reinterpret_cast<const uint2*>(
                  qs + (8 * (NB + n) + g) * S::kQRow + 32 * kk + 8 * t);
              mma16832_s8(sn[n], ka.x, kb2.x, ka.y, kb2.y, qv.x, qv.y);
            }
          } else {
            const uint32_t xa = ka.x ^ kSignFlip, xb = kb2.x ^ kSignFlip;
            const uint32_t ya = ka.y ^ kSignFlip, yb = kb2.y ^ kSignFlip;
            const uint32_t a0 = f16x2_sel<0x4140>(xa, k64), a1 = f16x2_sel<0x4140>(xb, k64);
            const uint32_t a2 = f16x2_sel<0x4342>(xa, k64), a3 = f16x2_sel<0x4342>(xb, k64);
            const uint32_t c0 = f16x2_sel<0x4140>(ya, k64), c1 = f16x2_sel<0x4140>(yb, k64);
            const uint32_t c2 = f16x2_sel<0x4342>(ya, k64), c3 = f16x2_sel<0x4342>(yb, k64);
#pragma unroll
            for (int n = 0; n < NC; ++n) {
              const uint4 qv = *reinterpret_cast<const uint4*>(
                  qs + (8 * (NB + n) + g) * S::kQRow + 16 * t + 64 * kk);
              mma16816(sf[n], a0, a1, a2, a3, qv.x, qv.y);
              mma16816(sf[n], c0, c1, c2, c3, qv.z, qv.w);
            }
          }
        }
      };
      using I0 = std::integral_constant<int, 0>;
      float s[NH][4];
      int si[NH][4];  // IQK: the int32 scores
      if constexpr (S::kDimSplit) {
        // this warp's half of the head dimension for every n-tile; the partner's columns'
        // partial sums out, this warp's columns' in (raw accumulators: fp32, IQK int32)
        constexpr int KH = KSTEPS2 / 2;
        float sp[NT][4];
        int sip[NT][4];
        qk(I0{}, std::integral_constant<int, NT>{},
           std::integral_constant<int, decltype(half)::value * KH>{},
           std::integral_constant<int, KH>{}, sp, sip);
        uint4* xc = reinterpret_cast<uint4*>(smem + S::kXchgOff) + tile * NT * 32 + lane;
        auto bits = [&](int n) {
          if constexpr (IQK) {
            return make_uint4(sip[n][0], sip[n][1], sip[n][2], sip[n][3]);
          } else {
            return make_uint4(__float_as_uint(sp[n][0]), __float_as_uint(sp[n][1]),
                              __float_as_uint(sp[n][2]), __float_as_uint(sp[n][3]));
          }
        };
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          if (n < N0 || n >= N0 + NN) xc[n * 32] = bits(n);
        }
        pair_sync(tile);
#pragma unroll
        for (int n = 0; n < NN; ++n) {
          const uint4 o = xc[(N0 + n) * 32];
          if constexpr (IQK) {
            si[n][0] = sip[N0 + n][0] + static_cast<int>(o.x);
            si[n][1] = sip[N0 + n][1] + static_cast<int>(o.y);
            si[n][2] = sip[N0 + n][2] + static_cast<int>(o.z);
            si[n][3] = sip[N0 + n][3] + static_cast<int>(o.w);
          } else {
            s[n][0] = sp[N0 + n][0] + __uint_as_float(o.x);
            s[n][1] = sp[N0 + n][1] + __uint_as_float(o.y);
            s[n][2] = sp[N0 + n][2] + __uint_as_float(o.z);
            s[n][3] = sp[N0 + n][3] + __uint_as_float(o.w);
          }
        }
      } else {
        qk(std::integral_constant<int, N0>{}, std::integral_constant<int, NN>{}, I0{},
           std::integral_constant<int, KSTEPS2>{}, s, si);
      }
      if constexpr (IQK) {  // the columns' query scales
#pragma unroll
        for (int n = 0; n < NN; ++n) {
          const float2 sq = *reinterpret_cast<const float2*>(qsc + 8 * (N0 + n) + 2 * t);
          s[n][0] = static_cast<float>(si[n][0]) * sq.x;
          s[n][1] = static_cast<float>(si[n][1]) * sq.y;
          s[n][2] = static_cast<float>(si[n][2]) * sq.x;
          s[n][3] = static_cast<float>(si[n][3]) * sq.y;
        }
      }
      const TileRows tr = tile_rows<HD>(w, row_g, row_g8, stage_pos + tile * kSlots, rg, rg8);
#pragma unroll
      for (int n = 0; n < NN; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e)
          scale_and_mask(p, w, tr, 8 * (N0 + n) + 2 * t + e, s[n][e], s[n][2 + e]);
      }
      // P^T of n-tile n (the half's n-tile N0 + n) into shared memory: v = rows g (e = 0, 1)
      // and g + 8 (2, 3); after the transpose lane (g, t) holds column 8n + g at k rows 2t,
      // 2t + 1 (and + 8)
      auto store_pt = [&](int n, const float (&v)[4]) {
        uint8_t* prow = ps + (8 * (N0 + n) + g) * S::kPRow + (kSlots * tile + 2 * t) * 2;
        *reinterpret_cast<uint32_t*>(prow) = transpose8x8(pack_f16x2(v[0], v[1]));
        *reinterpret_cast<uint32_t*>(prow + 16) = transpose8x8(pack_f16x2(v[2], v[3]));
      };
      if constexpr (LM) {
        // The lazy path (after the first stage): P against the running maxima and the running
        // V-scale maximum as they are, no tile maxima exchanged; valid where no score of the
        // stage exceeds its column's maximum by more than kLazyHeadroom (P <= 2^8 in fp16) and
        // no V scale the running maximum by kLazyVScaleHeadroom. One barrier that also ORs the
        // lanes' verdicts: if any lane's values leave those bounds the stage is redone on the
        // exact path below.
        if (st > 0) {
          const float inv_ref = 1.f / run_vmax;
          bool over = lazy_vscale_over(tr, run_vmax);
          float linc[NH][2];
#pragma unroll
          for (int n = 0; n < NN; ++n) {
            float pv[4];
#pragma unroll
            for (int e = 0; e < 2; ++e)
              linc[n][e] = lazy_column(m[n][e], s[n][e], s[n][2 + e], tr, inv_ref, over, pv[e],
                                       pv[2 + e]);
            store_pt(n, pv);
          }
          if (!__syncthreads_or(over)) {  // every P^T is in, the accumulators stand
#pragma unroll
            for (int n = 0; n < NN; ++n) {
              l[n][0] += linc[n][0];
              l[n][1] += linc[n][1];
            }
            exact = false;
            return;
          }
        }
        stage_vmax();
      }
#pragma unroll
      for (int n = 0; n < NN; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * (N0 + n) + 2 * t + e;
          const float mx = tile_rows_max(s[n][e], s[n][2 + e]);
          if (g == 0) red[col * T + tile] = mx;
        }
      }
      __syncthreads();  // every tile's maxima are in
#pragma unroll
      for (int n = 0; n < NN; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * (N0 + n) + 2 * t + e;
          const float a = exact_column(m[n][e], l[n][e], stage_max<T>(red, col), s[n][e],
                                       s[n][2 + e], tr, vs.inv_vmax, s[n][e], s[n][2 + e]);
          if (tile == 0 && g == 0) fac[col] = a * vs.vr;  // the accumulator's factor
        }
        store_pt(n, s[n]);
      }
    };
    with_half<T, S::kHalves>(warp, scores);

    if (exact) {  // the same in every thread
      run_vmax = vs.new_vmax;
      __syncthreads();  // the stage's P^T and the columns' factors are in

      // ---- the accumulator's factors of every column (written by the columns' first tile)
      float f[NT][2];
      bool rescale = false;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float2 fv = *reinterpret_cast<const float2*>(fac + 8 * n + 2 * t);
        f[n][0] = fv.x;
        f[n][1] = fv.y;
        rescale |= fv.x != 1.f || fv.y != 1.f;
      }
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int i = 0; i < 2 * U; ++i)
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            acc[i][n][0] *= f[n][0];
            acc[i][n][1] *= f[n][1];
            acc[i][n][2] *= f[n][0];
            acc[i][n][3] *= f[n][1];
          }
      }
    }

    // ---- O^T += V^T . P^T over the stage's tiles, this warp's dimensions: word c = 8 pp + g
    // of slots r0..r3 -> dimensions 4c..4c+3
#pragma unroll
    for (int ks = 0; ks < T; ++ks) {
      uint32_t bf[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n) ldmatrix_x2(bf[n], p_lane + 8 * n * S::kPRow + 32 * ks);
      const uint8_t* tv = base + ks * kSlots * S::kSRow + HD + 4;
      const uint8_t* v0 = tv + r0 * S::kSRow;
      const uint8_t* v1 = tv + r1 * S::kSRow;
      const uint8_t* v2 = tv + r2 * S::kSRow;
      const uint8_t* v3 = tv + r3 * S::kSRow;
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const int off = 4 * (8 * (U * warp + j) + g);
        const uint32_t w0 = ld_u32(v0 + off) ^ kSignFlip, w1 = ld_u32(v1 + off) ^ kSignFlip;
        const uint32_t w2 = ld_u32(v2 + off) ^ kSignFlip, w3 = ld_u32(v3 + off) ^ kSignFlip;
        const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
        const uint32_t lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
        const uint32_t x0 = f16x2_sel<0x4140>(lo01, k64), x1 = f16x2_sel<0x4342>(lo01, k64);
        const uint32_t x2 = f16x2_sel<0x4140>(lo23, k64), x3 = f16x2_sel<0x4342>(lo23, k64);
        const uint32_t y0 = f16x2_sel<0x4140>(hi01, k64), y1 = f16x2_sel<0x4342>(hi01, k64);
        const uint32_t y2 = f16x2_sel<0x4140>(hi23, k64), y3 = f16x2_sel<0x4342>(hi23, k64);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          mma16816(acc[2 * j][n], x0, x1, x2, x3, bf[n][0], bf[n][1]);
          mma16816(acc[2 * j + 1][n], y0, y1, y2, y3, bf[n][0], bf[n][1]);
        }
      }
    }
  }
  cp_async_wait<0>();
  pdl_trigger(p.pdl, 2);

  // ---- the row sums: over the lanes of a tile, then over the tiles
  for_half_columns<T, S::kHalves, NT>(warp, t, [&](int n, int e, int col) {
    const float ls = tile_rows_sum(l[n][e]);
    if (g == 0) red[col * T + tile] = ls;
  });
  __syncthreads();

  // ---- the log2-sum-exp of each column, by its half's first tile
  if (p.num_segs > 1 && tile == 0 && g == 0) {
    for_half_columns<T, S::kHalves, NT>(warp, t, [&](int n, int e, int col) {
      if (col >= w.n_cols) return;
      const float ls = stage_sum<T>(red, col);
      const int tq = col / p.group;
      const int hq = kvh * p.group + (col - tq * p.group);
      p.part_lse[sel * p.stride_lr + tq * p.stride_lt + hq * p.stride_lh + seg] =
          ls > 0.f ? m[n][e] + log2f(ls) : -INFINITY;
    });
  }

  // ---- write this warp's dimensions of every column
  const bool direct = p.num_segs == 1;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * n + 2 * t + e;
      if (col >= w.n_cols) continue;
      const float ls = stage_sum<T>(red, col);
      const int tq = col / p.group;
      const int hq = kvh * p.group + (col - tq * p.group);
      const float inv = ls > 0.f ? run_vmax / ls : 0.f;
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const int d = 4 * (8 * (U * warp + j) + g);
        const float o[4] = {acc[2 * j][n][e] * inv, acc[2 * j][n][2 + e] * inv,
                            acc[2 * j + 1][n][e] * inv, acc[2 * j + 1][n][2 + e] * inv};
        if (direct) store_column(p, sel, seg, w.q_start, true, tq, hq, d, o);
        else if (ls > 0.f) store_column(p, sel, seg, w.q_start, false, tq, hq, d, o);
      }
    }
  }
}

template <int HD, int NT, bool IQK, bool DS, bool LM>
cudaError_t launch_form(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  using S = VShape<HD, NT, IQK, DS>;
  return launch_verify<int8_verify_kernel<HD, NT, IQK, DS, LM>>(p, num_selected, S::kThreads,
                                                               S::kSmem, stream);
}

// The kernel form of the call: the head-dimension split (p.dim_split = 2) where the shape has
// one (the two forms are the same kernel elsewhere), the lazy maxima (p.lazy_max) with exact
// Q.K.
template <int HD, int NT, bool IQK>
cudaError_t launch_variant(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  constexpr bool kCanSplit = VShape<HD, NT, IQK, true>::kDimSplit;
  const bool split = kCanSplit && p.dim_split == 2;
  if constexpr (!IQK) {
    if (p.lazy_max) {
      return split ? launch_form<HD, NT, IQK, kCanSplit, true>(p, num_selected, stream)
                   : launch_form<HD, NT, IQK, false, true>(p, num_selected, stream);
    }
  }
  return split ? launch_form<HD, NT, IQK, kCanSplit, false>(p, num_selected, stream)
               : launch_form<HD, NT, IQK, false, false>(p, num_selected, stream);
}

template <int HD, int NT>
cudaError_t launch(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  return p.int_qk ? launch_variant<HD, NT, true>(p, num_selected, stream)
                  : launch_variant<HD, NT, false>(p, num_selected, stream);
}

template <int HD>
cudaError_t launch_hd(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  return for_ntiles(p, [&](auto nt) {
    return launch<HD, decltype(nt)::value>(p, num_selected, stream);
  });
}

}  // namespace

bool int8_verify_supported(int head_dim) {
  return attn::head_dim_compiled(head_dim);
}

cudaError_t int8_verify_launch(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  if (num_selected <= 0 || p.num_kv_heads <= 0 || p.num_segs <= 0) return cudaSuccess;
  if (p.group < 1 || p.max_q < 1 || p.group * p.max_q > kInt8VerifyMaxCols ||
      p.block_size % kSlots != 0)
    return cudaErrorInvalidValue;
  return attn::for_head_dim(p.head_dim, [&](auto hd) {
    return launch_hd<decltype(hd)::value>(p, num_selected, stream);
  });
}

}  // namespace vllm_prism
