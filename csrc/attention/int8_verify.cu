// Split-KV verification attention over the paged INT8 cache on the fp16 tensor cores
// (int8_attention.cuh has the parameters). The tile algebra is the decode kernel's
// (int8_decode.cu): per 16-slot tile, with the slots as the MMA's M rows,
//
//   S^T [16 slots x 8 columns] = K . Q^T       (columns: query token x GQA head)
//   O^T [hd x 8 columns]      += V^T . P^T
//
// The query tokens are folded into the GQA group (column = token x group + head) and the
// columns are split over the warps in blocks of 8 (n-tiles): warp w owns the NPW n-tiles
// NPW w .. NPW w + NPW - 1 over the whole head dimension and runs the decode kernel's loop for
// them with its own online softmax, no exchange between warps. A warp builds the fp16 operands
// of a K or V fragment from the int8 bits once and uses them for all its n-tiles (NPW = 2 up
// to 32 columns; 33..48 columns take one warp per n-tile, see launch_hd); Q (fp16, scaled)
// waits in shared memory; n-tiles wholly past the request's columns are skipped.
//
// The accumulator is kept in units of the running maximum of the V scales seen so far (P^T
// carries v_scale[slot] / that maximum, in [0, 1]); a tile that raises neither a column's
// score maximum nor the V-scale maximum leaves the accumulator as it is (no rescaling).
//
// One CTA per (request, KV head, segment); the head's rows (2 hd + 8 bytes, 8-byte aligned in
// any vLLM layout) are copied with 8-byte cp.async into shared memory rows padded to a stride
// of 8 words mod 32, one 16-slot tile a stage, four stages; the decode kernel's
// bank-conflict-free slot order applies. Prefix and causal tail run in one pass: column
// (token t, head j) sees positions <= prefix + t.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "int8_tile.cuh"
#include "int8_attention.cuh"

namespace vllm_prism {
namespace {

using namespace attn;

constexpr int kSlots = 16;
constexpr int kStages = 4;

template <int HD, int NW, int NPW>
struct VShape {
  static constexpr int kThreads = NW * 32;
  static constexpr int kCols = 8 * NW * NPW;
  // Resident CTAs the registers are sized for. Each of a multiprocessor's four schedulers
  // holds the registers of its own warps (16K): two n-tiles a warp (one or two warps) take
  // about 208 registers, two warps a scheduler; one n-tile a warp (five or six warps) 128, four.
  static constexpr int kMinBlocks = NPW == 2 ? 4 : (15 / NW < 4 ? 15 / NW : 4);
  static constexpr int kRow = 2 * HD + 8;  // bytes of one (slot, head) row in the cache
  static constexpr int kChunks = kRow / 8;
  // shared-memory row stride: words = 8 mod 32 (conflict-free K and V reads)
  static constexpr int kSRow = 4 * (((kRow / 4 - 8 + 31) / 32) * 32 + 8);
  static constexpr int kStageBytes = kSlots * kSRow;
  static constexpr int kQRow = 2 * HD + 64;  // fp16 query rows: words = 16 mod 32
  static constexpr int kSmem = kStages * kStageBytes + kCols * kQRow;
  static_assert(kRow % 8 == 0 && kSRow >= kRow && (kSRow / 4) % 32 == 8, "row layout");
};

template <int HD, int NW, int NPW>
__global__ void __launch_bounds__(VShape<HD, NW, NPW>::kThreads, VShape<HD, NW, NPW>::kMinBlocks)
    int8_verify_kernel(const Int8AttnParams p) {
  using S = VShape<HD, NW, NPW>;
  constexpr int KSTEPS2 = HD / 32;  // pairs of k-steps (QK) = word groups (PV)
  constexpr int MT = HD / 16;  // O^T accumulator tiles
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* stages = smem;
  uint8_t* qs = smem + kStages * S::kStageBytes;

  const int sel = blockIdx.x;
  const int kvh = blockIdx.y;
  const int seg = blockIdx.z;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  const int req = p.req_ids != nullptr ? p.req_ids[sel] : sel;
  const int q_start = p.qsl[req];
  const int q_len = min(p.qsl[req + 1] - q_start, p.max_q);
  if (q_len <= 0) return;
  const int seq_len = p.seq_lens[req];
  const int prefix = max(seq_len - q_len, 0);
  const int n_cols = q_len * p.group;
  const int n_tiles = (seq_len + kSlots - 1) / kSlots;
  const int tps = max((n_tiles + p.num_segs - 1) / p.num_segs, p.min_tiles);
  const int t0 = seg * tps;
  const int t1 = min(t0 + tps, n_tiles);
  const int n_iter = t1 > t0 ? t1 - t0 : 0;
  const int32_t* bt = p.block_table + static_cast<int64_t>(req) * p.stride_bt;
  const uint8_t* cache = reinterpret_cast<const uint8_t*>(p.cache) +
                         static_cast<int64_t>(kvh) * p.stride_ch;

  auto issue = [&](int it) {
    const int pos0 = (t0 + it) * kSlots;  // a tile lies in one block (block size % 16 == 0)
    const int blk = bt[pos0 / p.block_size];
    const uint8_t* src = cache + static_cast<int64_t>(blk) * p.stride_cb +
                         static_cast<int64_t>(pos0 % p.block_size) * p.stride_cn;
    const uint32_t dst = smem_u32(stages + (it % kStages) * S::kStageBytes);
    for (int c = threadIdx.x; c < kSlots * S::kChunks; c += S::kThreads) {
      const int slot = c / S::kChunks;
      const int ch = c - slot * S::kChunks;
      cp_async8(dst + slot * S::kSRow + ch * 8, src + slot * p.stride_cn + ch * 8);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_iter) issue(s);
    cp_async_commit();
  }

  // Q (scaled by qk_scale) as fp16 rows: column c = token * group + head of the group (zero
  // past the request's columns); read after the loop's first barrier.
  for (int i = threadIdx.x; i < S::kCols * (HD / 8); i += S::kThreads) {
    const int c = i / (HD / 8);
    const int d = (i - c * (HD / 8)) * 8;
    uint32_t h[4] = {0u, 0u, 0u, 0u};
    if (c < n_cols) {
      const int tq = c / p.group;
      const int hq = kvh * p.group + (c - tq * p.group);
      const int64_t elem = static_cast<int64_t>(q_start + tq) * p.stride_qt +
                           static_cast<int64_t>(hq) * p.stride_qh + d;
      load_q8(reinterpret_cast<const uint8_t*>(p.q) + elem * 2, p.q_dtype, p.qk_scale, h);
    }
    *reinterpret_cast<uint4*>(qs + c * S::kQRow + d * 2) = make_uint4(h[0], h[1], h[2], h[3]);
  }

  // the fp16 filler 0x64 in every byte, in a register the compiler cannot fold (head_dim <
  // 65536): see f16x2_sel
  const uint32_t k64 = 0x64646464u | (static_cast<uint32_t>(p.head_dim) >> 16);
  float acc[MT][NPW][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int n = 0; n < NPW; ++n) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.f;
  float m[NPW][2], l[NPW][2];
  int lim[NPW][2];  // the last visible position of this thread's columns
  bool live[NPW];  // the n-tile has a column of the request
  const uint8_t* qrow[NPW];
#pragma unroll
  for (int n = 0; n < NPW; ++n) {
    const int c0 = 8 * (warp * NPW + n);
    live[n] = c0 < n_cols;
    qrow[n] = qs + (c0 + g) * S::kQRow + 16 * t;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      m[n][e] = -INFINITY;
      l[n][e] = 0.f;
      lim[n][e] = prefix + (c0 + 2 * t + e) / p.group;
    }
  }
  float run_vmax = 1e-30f;  // running maximum of the V scales (positive: all-zero V is fine)

  const int rg = slot_of_row(g);  // S^T rows g and g + 8
  const int rg8 = rg + 8;
  const int r0 = slot_of_row(2 * t);  // P^T / V^T k rows 2t, 2t+1, 2t+8, 2t+9
  const int r1 = slot_of_row(2 * t + 1);
  const int r2 = r0 + 8;
  const int r3 = r1 + 8;

  for (int it = 0; it < n_iter; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (it + kStages - 1 < n_iter) issue(it + kStages - 1);
    cp_async_commit();

    const uint8_t* base = stages + (it % kStages) * S::kStageBytes;
    const uint8_t* row_g = base + rg * S::kSRow;
    const uint8_t* row_g8 = base + rg8 * S::kSRow;

    // ---- S^T = K . Q^T, each K fragment for every n-tile of the warp
    float s[NPW][4];
#pragma unroll
    for (int n = 0; n < NPW; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS2; ++kk) {
      const uint2 ka = *reinterpret_cast<const uint2*>(row_g + 32 * kk + 8 * t);
      const uint2 kb = *reinterpret_cast<const uint2*>(row_g8 + 32 * kk + 8 * t);
      const uint32_t xa = ka.x ^ kSignFlip, xb = kb.x ^ kSignFlip;
      const uint32_t ya = ka.y ^ kSignFlip, yb = kb.y ^ kSignFlip;
      const uint32_t a0 = f16x2_sel<0x4140>(xa, k64), a1 = f16x2_sel<0x4140>(xb, k64);
      const uint32_t a2 = f16x2_sel<0x4342>(xa, k64), a3 = f16x2_sel<0x4342>(xb, k64);
      const uint32_t c0 = f16x2_sel<0x4140>(ya, k64), c1 = f16x2_sel<0x4140>(yb, k64);
      const uint32_t c2 = f16x2_sel<0x4342>(ya, k64), c3 = f16x2_sel<0x4342>(yb, k64);
#pragma unroll
      for (int n = 0; n < NPW; ++n) {
        if (!live[n]) continue;
        const uint4 qv = *reinterpret_cast<const uint4*>(qrow[n] + 64 * kk);
        mma16816(s[n], a0, a1, a2, a3, qv.x, qv.y);
        mma16816(s[n], c0, c1, c2, c3, qv.z, qv.w);
      }
    }

    // ---- online softmax (columns 2t, 2t + 1 of each n-tile), P^T operands
    const int pos0 = (t0 + it) * kSlots;
    const int pg = pos0 + rg, pg8 = pos0 + rg8;
    const float ks_g = ld_f32(row_g + HD), ks_g8 = ld_f32(row_g8 + HD);
    float vs_g = ld_f32(row_g + 2 * HD + 4), vs_g8 = ld_f32(row_g8 + 2 * HD + 4);
    if (pg >= seq_len) vs_g = 0.f;  // slots past the end hold garbage
    if (pg8 >= seq_len) vs_g8 = 0.f;
    float vmax = fmaxf(vs_g, vs_g8);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, o));
    const float new_vmax = fmaxf(run_vmax, vmax);
    const float vr = new_vmax > run_vmax ? run_vmax / new_vmax : 1.f;
    const float inv_vmax = 1.f / new_vmax;
    run_vmax = new_vmax;
    const bool masked = pos0 + kSlots - 1 > prefix;  // the tile reaches the causal tail
    float f[NPW][2];
    uint32_t b0[NPW], b1[NPW];
    bool rescale = false;
#pragma unroll
    for (int n = 0; n < NPW; ++n) {
      float pr[4];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float sa = s[n][e] * ks_g, sb = s[n][2 + e] * ks_g8;
        if (masked) {
          if (pg > lim[n][e] || pg >= seq_len) sa = -INFINITY;
          if (pg8 > lim[n][e] || pg8 >= seq_len) sb = -INFINITY;
        }
        float mx = fmaxf(sa, sb);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float mn = fmaxf(m[n][e], mx);
        const float mu = mn == -INFINITY ? 0.f : mn;
        const float a = mn == m[n][e] ? 1.f : exp2f(m[n][e] - mu);
        const float pa = exp2f(sa - mu), pb = exp2f(sb - mu);
        l[n][e] = l[n][e] * a + pa + pb;
        m[n][e] = mn;
        f[n][e] = a * vr;
        rescale |= f[n][e] != 1.f;
        pr[e] = pa * vs_g * inv_vmax;
        pr[2 + e] = pb * vs_g8 * inv_vmax;
      }
      b0[n] = transpose8x8(pack_f16x2(pr[0], pr[1]));
      b1[n] = transpose8x8(pack_f16x2(pr[2], pr[3]));
    }
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int n = 0; n < NPW; ++n) {
          acc[i][n][0] *= f[n][0];
          acc[i][n][1] *= f[n][1];
          acc[i][n][2] *= f[n][0];
          acc[i][n][3] *= f[n][1];
        }
    }

    // ---- O^T += V^T . P^T: word c = 8 pp + g of slots r0..r3 -> dims 4c..4c+3
    const uint8_t* v0 = base + r0 * S::kSRow + HD + 4;
    const uint8_t* v1 = base + r1 * S::kSRow + HD + 4;
    const uint8_t* v2 = base + r2 * S::kSRow + HD + 4;
    const uint8_t* v3 = base + r3 * S::kSRow + HD + 4;
#pragma unroll
    for (int pp = 0; pp < KSTEPS2; ++pp) {
      const int off = 4 * (8 * pp + g);
      const uint32_t w0 = ld_u32(v0 + off) ^ kSignFlip, w1 = ld_u32(v1 + off) ^ kSignFlip;
      const uint32_t w2 = ld_u32(v2 + off) ^ kSignFlip, w3 = ld_u32(v3 + off) ^ kSignFlip;
      const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
      const uint32_t lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
      const uint32_t x0 = f16x2_sel<0x4140>(lo01, k64), x1 = f16x2_sel<0x4342>(lo01, k64);
      const uint32_t x2 = f16x2_sel<0x4140>(lo23, k64), x3 = f16x2_sel<0x4342>(lo23, k64);
      const uint32_t y0 = f16x2_sel<0x4140>(hi01, k64), y1 = f16x2_sel<0x4342>(hi01, k64);
      const uint32_t y2 = f16x2_sel<0x4140>(hi23, k64), y3 = f16x2_sel<0x4342>(hi23, k64);
#pragma unroll
      for (int n = 0; n < NPW; ++n) {
        if (!live[n]) continue;
        mma16816(acc[2 * pp][n], x0, x1, x2, x3, b0[n], b1[n]);
        mma16816(acc[2 * pp + 1][n], y0, y1, y2, y3, b0[n], b1[n]);
      }
    }
  }
  cp_async_wait<0>();

  // ---- write this warp's columns, every dimension
  const bool direct = p.num_segs == 1;
#pragma unroll
  for (int n = 0; n < NPW; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float ls = l[n][e];
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) ls += __shfl_xor_sync(0xffffffffu, ls, o);
      const int col = 8 * (warp * NPW + n) + 2 * t + e;
      if (col >= n_cols) continue;
      const int tq = col / p.group;
      const int hq = kvh * p.group + (col - tq * p.group);
      const float inv = ls > 0.f ? run_vmax / ls : 0.f;
#pragma unroll
      for (int pp = 0; pp < KSTEPS2; ++pp) {
        const int d = 4 * (8 * pp + g);
        const float o[4] = {acc[2 * pp][n][e] * inv, acc[2 * pp][n][2 + e] * inv,
                            acc[2 * pp + 1][n][e] * inv, acc[2 * pp + 1][n][2 + e] * inv};
        if (direct) {
          uint8_t* op = reinterpret_cast<uint8_t*>(p.out) +
                        (static_cast<int64_t>(q_start + tq) * p.stride_ot +
                         static_cast<int64_t>(hq) * p.stride_oh + d) * 2;
          store_out(op, p.out_dtype, o);
        } else if (ls > 0.f) {
          float* po = p.part_o + sel * p.stride_pr + tq * p.stride_pt + hq * p.stride_ph +
                      seg * p.stride_ps + d;
          *reinterpret_cast<float4*>(po) = make_float4(o[0], o[1], o[2], o[3]);
        }
      }
      if (!direct && g == 0)
        p.part_lse[sel * p.stride_lr + tq * p.stride_lt + hq * p.stride_lh + seg] =
            ls > 0.f ? m[n][e] + log2f(ls) : -INFINITY;
    }
  }
}

template <int HD, int NW, int NPW>
cudaError_t launch(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  using S = VShape<HD, NW, NPW>;
  static const cudaError_t attr = cudaFuncSetAttribute(
      int8_verify_kernel<HD, NW, NPW>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem);
  if (attr != cudaSuccess) return attr;
  // the largest shared-memory carveout: the driver's default may leave room for fewer CTAs
  static const cudaError_t carve = cudaFuncSetAttribute(
      int8_verify_kernel<HD, NW, NPW>, cudaFuncAttributePreferredSharedMemoryCarveout,
      cudaSharedmemCarveoutMaxShared);
  if (carve != cudaSuccess) return carve;
  int8_verify_kernel<HD, NW, NPW>
      <<<dim3(num_selected, p.num_kv_heads, p.num_segs), S::kThreads, S::kSmem, stream>>>(p);
  return cudaGetLastError();
}

// Up to four n-tiles of 8 columns: one warp per two (each K / V fragment decoded once for 16
// columns); five or six n-tiles: one warp each (at 208 registers, three warps of two n-tiles
// leave too few warps a multiprocessor: 1.2-1.3x slower on the H200).
template <int HD>
cudaError_t launch_hd(const Int8AttnParams& p, int num_selected, cudaStream_t stream) {
  switch ((p.group * p.max_q + 7) / 8) {
    case 1: return launch<HD, 1, 1>(p, num_selected, stream);
    case 2: return launch<HD, 1, 2>(p, num_selected, stream);
    case 3:
    case 4: return launch<HD, 2, 2>(p, num_selected, stream);
    case 5: return launch<HD, 5, 1>(p, num_selected, stream);
    case 6: return launch<HD, 6, 1>(p, num_selected, stream);
    default: return cudaErrorInvalidValue;
  }
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
