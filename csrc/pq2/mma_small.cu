// PQ2 linear for M = 1..16 on int8 tensor cores (see mma_small.cuh). Torch-free; the torch op
// is in mma_small_op.cu.
//
// A CTA: TILES x 16 consecutive weight rows (16..128), the whole of K, 8 warps. All codes
// (row stride K/4 + 16 bytes: the 8 rows a warp instruction reads start 4 banks apart, so a
// 16-byte read of each is conflict-free) and fp16 scales of its rows go to shared memory
// first. Warp w then takes the 128-groups [w G / 8, (w + 1) G / 8) of K: per 64-weight piece it
// loads its lane's B fragments (tokens g + 8 nt, 4 bytes at k 4t and 16 + 4t of each 32-chunk)
// once, and for every row tile reads rows g and g + 8 as one 16-byte word quad each and
// decodes the A fragments with a shift and an AND per register; one mma.sync per tile, chunk
// and token tile. At each group's end the int32 sums are taken to fp32 exactly (magic-number
// add), offset by the activation's group sum and scaled by d[row] * sx[token]. The 8 warps'
// partial sums meet in shared memory (over the codes, which are no longer read) and are added
// in warp order, so the result does not depend on timing.
//
// PIPE (the "pipelined" variant, op argument variant = 1): the same arithmetic in the same
// order, so bit-identical results, with the loads laid out for overlap: each warp requests the
// codes of its own K slice, one commit group per 128-group, and starts on a group as soon as
// that group has landed (no CTA barrier between loading and computing but one for the
// scales); for one token tile (M <= 8) the activation's B fragments of the next 64-weight
// piece are requested before the current piece's MMAs (with two, the registers would spill).
//
// STREAM (op argument variant = 2, pq2_mma_stream_kernel below): no shared-memory staging of
// the codes. A warp owns one 16-row tile and a K slice of whole 128-groups; lane (g, t) loads
// 8 bytes of row g and of row g + 8 per group straight into registers (bytes 8t .. 8t + 7 of
// the group's 32: the four lanes of a row read one 32-byte sector, 512 bytes a warp load), the
// loads of up to P groups issued at once (the first ones before the grid-dependency wait), like
// the GEMV (gemv_int8.cu). The MMA's k index is permuted within each group so that a lane's
// A fragments are exactly its own 8 bytes: at step c (0..3) of a group, k 4t + b of the MMA is
// the group's element 32t + 8c + b and k 16 + 4t + b its element 32t + 8c + 4 + b, for A
// (word c / 2 of the lane's pair, shifted by 2 (2 (c % 2)) and 2 (2 (c % 2) + 1)) and for B
// alike (words 2c and 2c + 1 of the lane's 32 activation bytes at 32t of the group, two
// 16-byte loads a group through L1), so each group is still one exact int32 sum. The warps of
// a tile (KS of them) add their fp32 partials in shared memory in K order.
//
// PERSIST (op variant 5, pq2_mma_persist_kernel): STREAM's warps in as many CTAs as stay
// resident, walking the matrix with the next item's loads in flight (see the kernel).
#include "mma_small.cuh"

#include "pq2_device.cuh"

namespace vllm_prism {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr uint32_t kMask = 0x03030303u;
constexpr int kSmemTarget = 110 * 1024;  // two CTAs a multiprocessor
constexpr int kSmemMax = 200 * 1024;

// Byte offsets in a CTA's dynamic shared memory.
struct SmallSmem {
  int row_bytes, row_stride, scale_words, scales, red_bytes, bytes;

  __host__ __device__ SmallSmem(int k, int rows, int nt) {
    row_bytes = k / 4;
    row_stride = row_bytes + 16;
    scale_words = (k / 128 + 1) / 2;  // fp16 pairs
    scales = rows * row_stride;       // codes at 0
    const int end = scales + align16(4 * rows * scale_words);
    red_bytes = kWarps * (rows / 16) * nt * 4 * 32 * 4;  // fp32 partials, over the codes
    bytes = end > red_bytes ? end : red_bytes;
  }
};

// B fragments of one 64-weight piece (two 32-chunks) for each token tile: 4-byte loads at k 4t
// and 16 + 4t of each chunk.
template <int NT>
__device__ __forceinline__ void load_b(uint32_t (&b)[NT][2][2], const int8_t* const (&xrow)[NT],
                                       int piece, int t) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int8_t* xk = xrow[nt] + 64 * piece + 4 * t;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      b[nt][c][0] = __ldg(reinterpret_cast<const uint32_t*>(xk + 32 * c));
      b[nt][c][1] = __ldg(reinterpret_cast<const uint32_t*>(xk + 32 * c + 16));
    }
  }
}

template <int TILES, int NT, bool PIPE>
__global__ void __launch_bounds__(kThreads)
    pq2_mma_small_kernel(const __grid_constant__ Pq2LinearParams p) {
  extern __shared__ __align__(16) char smem[];
  if (p.pdl) pdl_launch_dependents();
  constexpr int kRows = 16 * TILES;
  const SmallSmem L(p.k, kRows, NT);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kRows;
  const int groups = p.k / 128;
  const int grp_lo = warp * groups / kWarps, grp_hi = (warp + 1) * groups / kWarps;

  // 1. Every code and scale of the CTA's rows (rows past N read row N - 1, not stored);
  //    independent of the previous kernel, so before the grid-dependency wait. PIPE: the
  //    scales first (all threads), then each warp its K slice's codes group by group.
  const int pieces = L.row_bytes / 16;
  if constexpr (!PIPE) {
    for (int i = tid; i < kRows * pieces; i += kThreads) {
      const int r = i / pieces, j = i % pieces;
      const int row = min(row0 + r, p.n - 1);
      cp_async16(smem + r * L.row_stride + 16 * j,
                 reinterpret_cast<const char*>(p.codes + row * p.stride_c) + 16 * j);
    }
  }
  for (int i = tid; i < kRows * L.scale_words; i += kThreads) {
    const int r = i / L.scale_words, j = i % L.scale_words;
    const int row = min(row0 + r, p.n - 1);
    cp_async4(smem + L.scales + 4 * i, p.scales + row * p.stride_s + 2 * j);
  }
  cp_async_commit();
  if constexpr (PIPE) {
    for (int grp = grp_lo; grp < grp_hi; ++grp) {  // the group's two 16-byte pieces a row
      for (int i = lane; i < 2 * kRows; i += 32) {
        const int r = i >> 1, j = 2 * grp + (i & 1);
        const int row = min(row0 + r, p.n - 1);
        cp_async16(smem + r * L.row_stride + 16 * j,
                   reinterpret_cast<const char*>(p.codes + row * p.stride_c) + 16 * j);
      }
      cp_async_commit();
    }
  }
  if (p.pdl) pdl_wait();  // the activation is complete past here

  // This lane's tokens: its B column g + 8 nt, its C columns 8 nt + 2t and + 1 (past M:
  // token M - 1, not stored).
  const int8_t* xrow[NT];
  const float* sx_c[NT][2];
  const int32_t* qs_c[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    xrow[nt] = p.xq + min(8 * nt + g, p.m - 1) * p.stride_x;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int tok = min(8 * nt + 2 * t + c, p.m - 1);
      sx_c[nt][c] = p.sx + tok * p.stride_g;
      qs_c[nt][c] = p.qsum + tok * p.stride_g;
    }
  }

  float acc[TILES][NT][4];
  fill(acc, 0.f);

  if constexpr (PIPE) {
    cp_async_wait_at_most(grp_hi - grp_lo);  // the scales (the first group) have landed
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
  const uint32_t* scales = reinterpret_cast<const uint32_t*>(smem + L.scales);
  constexpr bool kPrefetchB = PIPE && NT == 1;
  uint32_t b[NT][2][2];  // [token tile][32-chunk of the piece][reg]
  if (kPrefetchB && grp_lo < grp_hi) load_b<NT>(b, xrow, 2 * grp_lo, t);

  for (int grp = grp_lo; grp < grp_hi; ++grp) {
    if constexpr (PIPE) {
      cp_async_wait_at_most(grp_hi - 1 - grp);  // this warp's copies of the group landed
      __syncwarp();                             // and are visible to all its lanes
    }
    int32_t isum[TILES][NT][4];
    fill(isum, 0);
    float s[NT][2];  // the group's activation scales and sums of this lane's C tokens,
    int32_t q[NT][2];  // requested before the group's MMAs
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        s[nt][c] = __ldg(sx_c[nt][c] + grp);
        q[nt][c] = __ldg(qs_c[nt][c] + grp);
      }
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // 64 weights: one 16-byte piece of each row
      const int piece = 2 * grp + half;
      uint32_t bn[NT][2][2];  // the next piece's, requested before this piece's MMAs
      if constexpr (kPrefetchB) {
        if (piece + 1 < 2 * grp_hi) load_b<NT>(bn, xrow, piece + 1, t);
      } else {
        load_b<NT>(b, xrow, piece, t);
      }
#pragma unroll
      for (int i = 0; i < TILES; ++i) {
        const char* rows_g = smem + (16 * i + g) * L.row_stride + 16 * piece;
        const uint4 wg = *reinterpret_cast<const uint4*>(rows_g);
        const uint4 wh = *reinterpret_cast<const uint4*>(rows_g + 8 * L.row_stride);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          uint32_t a[4];
          a[0] = (word_of(wg, 2 * c) >> (2 * t)) & kMask;      // row g, k 4t..
          a[1] = (word_of(wh, 2 * c) >> (2 * t)) & kMask;      // row g + 8
          a[2] = (word_of(wg, 2 * c + 1) >> (2 * t)) & kMask;  // row g, k 16 + 4t..
          a[3] = (word_of(wh, 2 * c + 1) >> (2 * t)) & kMask;  // row g + 8
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_s8(isum[i][nt], a, b[nt][c][0], b[nt][c][1]);
        }
      }
      if constexpr (kPrefetchB) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            b[nt][c][0] = bn[nt][c][0];
            b[nt][c][1] = bn[nt][c][1];
          }
      }
    }
    // Group end: y += d[row] * sx[token] * (sum - qsum[token]) for this lane's 4 (row, token).
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
      const int r = 16 * i + g;
      const int sh = 16 * (grp & 1);
      const float d0 = __half2float(__ushort_as_half(static_cast<unsigned short>(
          scales[r * L.scale_words + (grp >> 1)] >> sh)));
      const float d1 = __half2float(__ushort_as_half(static_cast<unsigned short>(
          scales[(r + 8) * L.scale_words + (grp >> 1)] >> sh)));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc[i][nt][0] += exact_float(isum[i][nt][0] - q[nt][0]) * (d0 * s[nt][0]);
        acc[i][nt][1] += exact_float(isum[i][nt][1] - q[nt][1]) * (d0 * s[nt][1]);
        acc[i][nt][2] += exact_float(isum[i][nt][2] - q[nt][0]) * (d1 * s[nt][0]);
        acc[i][nt][3] += exact_float(isum[i][nt][3] - q[nt][1]) * (d1 * s[nt][1]);
      }
    }
  }

  // The warps' partial sums, over the codes: red[warp][tile][nt][e][lane].
  __syncthreads();  // every warp is done with the codes
  float* red = reinterpret_cast<float*>(smem);
  constexpr int kOut = TILES * NT * 4 * 32;  // partials a warp holds
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp * kOut + ((i * NT + nt) * 4 + e) * 32 + lane] =
          acc[i][nt][e];
  __syncthreads();
  for (int o = tid; o < kOut; o += kThreads) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += red[w * kOut + o];
    const int ln = o & 31, e = (o >> 5) & 3, nt = (o >> 7) % NT, i = (o >> 7) / NT;
    const int row = row0 + 16 * i + (ln >> 2) + 8 * (e >> 1);
    const int tok = 8 * nt + 2 * (ln & 3) + (e & 1);
    if (row < p.n && tok < p.m) {
      const float bias = p.bias ? load_as_float(p.bias, row, p.bias_dtype) : 0.f;
      store_out(p, static_cast<int64_t>(tok) * p.stride_o + row, sum + bias);
    }
  }
}

template <int TILES, int NT, bool PIPE>
cudaError_t launch(const Pq2LinearParams& p, int bytes, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(pq2_mma_small_kernel<TILES, NT, PIPE>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.n + 16 * TILES - 1) / (16 * TILES), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(cfg, attr, p.pdl);
  return cudaLaunchKernelEx(&cfg, pq2_mma_small_kernel<TILES, NT, PIPE>, p);
}

template <int NT, bool PIPE>
cudaError_t launch_tiles(const Pq2LinearParams& p, int tiles, int bytes, cudaStream_t stream) {
  switch (tiles) {
    case 8: return launch<8, NT, PIPE>(p, bytes, stream);
    case 4: return launch<4, NT, PIPE>(p, bytes, stream);
    case 2: return launch<2, NT, PIPE>(p, bytes, stream);
    default: return launch<1, NT, PIPE>(p, bytes, stream);
  }
}

template <bool PIPE>
cudaError_t launch_nt(const Pq2LinearParams& p, int nt, int tiles, int bytes,
                      cudaStream_t stream) {
  return nt == 1 ? launch_tiles<1, PIPE>(p, tiles, bytes, stream)
                 : launch_tiles<2, PIPE>(p, tiles, bytes, stream);
}

// ------------------------------------------------------------- variant 2: STREAM (M <= 16)

// 8 bytes of codes, read-only, not kept in L1 (each is read once).
__device__ __forceinline__ uint2 load_codes8(const char* ptr) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n"
               : "=r"(v.x), "=r"(v.y) : "l"(ptr));
  return v;
}

// One warp's loads of up to P groups: the codes of rows g and g + 8 (8 bytes each) and the
// fp16 scales of both rows packed in one word.
template <int P>
struct StreamFrag {
  uint2 w0[P], w1[P];
  uint32_t d[P];
};

template <int P>
__device__ __forceinline__ void stream_load(StreamFrag<P>& f, const char* c0, const char* c1,
                                            const uint16_t* s0, const uint16_t* s1, int base,
                                            int hi) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int grp = base + i;
    if (grp < hi) {
      f.w0[i] = load_codes8(c0 + 32 * grp);
      f.w1[i] = load_codes8(c1 + 32 * grp);
      f.d[i] = static_cast<uint32_t>(__ldg(s0 + grp)) |
               (static_cast<uint32_t>(__ldg(s1 + grp)) << 16);
    }
  }
}

// A warp's place in a STREAM or PERSIST CTA of blockDim.x = 32 * KS * row tiles: warp w takes
// row tile rt = w / KS of the CTA's unit and K slice w % KS, the groups [lo, hi) of K.
struct StreamWarp {
  int g, t, rt, tiles_per_cta, lo, hi;

  __device__ __forceinline__ StreamWarp(int groups, int ks_count) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ks = warp % ks_count;
    g = lane >> 2;
    t = lane & 3;
    rt = warp / ks_count;
    tiles_per_cta = (blockDim.x >> 5) / ks_count;
    lo = ks * groups / ks_count;
    hi = (ks + 1) * groups / ks_count;
  }
};

// Where a lane's loads go in a CTA's unit of row tiles: the codes of rows g and g + 8 of its
// warp's 16-row tile (8 bytes at 8t of each group) and their fp16 scales.
struct StreamRows {
  const char *c0, *c1;
  const uint16_t *s0, *s1;
};

__device__ __forceinline__ StreamRows stream_rows(const Pq2LinearParams& p, int unit,
                                                  const StreamWarp& w) {
  const int row0 = (unit * w.tiles_per_cta + w.rt) * 16;
  const int r0 = min(row0 + w.g, p.n - 1), r1 = min(row0 + w.g + 8, p.n - 1);
  return {reinterpret_cast<const char*>(p.codes + r0 * p.stride_c) + 8 * w.t,
          reinterpret_cast<const char*>(p.codes + r1 * p.stride_c) + 8 * w.t,
          p.scales + r0 * p.stride_s, p.scales + r1 * p.stride_s};
}

// A warp's start: the loads of its first P groups of `unit` (before the grid-dependency wait:
// they do not depend on the previous kernel), then the wait; returns the unit's rows.
template <int P>
__device__ __forceinline__ StreamRows stream_start(StreamFrag<P>& f, const Pq2LinearParams& p,
                                                   const StreamWarp& w, int unit) {
  const StreamRows r = stream_rows(p, unit, w);
  stream_load<P>(f, r.c0, r.c1, r.s0, r.s1, w.lo, w.hi);
  if (p.pdl) pdl_wait();  // the activation is complete past here
  return r;
}

// This lane's tokens: B column g + 8 nt (its 32 bytes at 32t of a group), C columns 8 nt + 2t
// and + 1 (past M: token M - 1, not stored); 32-bit offsets (fewer registers).
template <int NT>
struct StreamTokens {
  int xoff[NT], goff[NT][2];

  __device__ __forceinline__ StreamTokens(const Pq2LinearParams& p, int g, int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      xoff[nt] = min(8 * nt + g, p.m - 1) * static_cast<int>(p.stride_x) + 32 * t;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        goff[nt][c] = min(8 * nt + 2 * t + c, p.m - 1) * static_cast<int>(p.stride_g);
      }
    }
  }
};

// Adds the loaded groups base .. base + P - 1 (those below hi) to the lane's sums.
template <int NT, int P>
__device__ __forceinline__ void stream_compute(float (&acc)[NT][4], const StreamFrag<P>& f,
                                               const Pq2LinearParams& p,
                                               const StreamTokens<NT>& tk, int base, int hi) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int grp = base + i;
    if (grp >= hi) break;
    uint4 bx[NT][2];
    float s[NT][2];
    int32_t q[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint4* xb = reinterpret_cast<const uint4*>(p.xq + tk.xoff[nt] + 128 * grp);
      bx[nt][0] = __ldg(xb);
      bx[nt][1] = __ldg(xb + 1);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        s[nt][c] = __ldg(p.sx + tk.goff[nt][c] + grp);
        q[nt][c] = __ldg(p.qsum + tk.goff[nt][c] + grp);
      }
    }
    int32_t isum[NT][4];
    mma_group_permuted<NT>(isum, f.w0[i], f.w1[i], bx);
    const float d0 = __half2float(__ushort_as_half(static_cast<unsigned short>(f.d[i])));
    const float d1 = __half2float(__ushort_as_half(static_cast<unsigned short>(f.d[i] >> 16)));
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      acc[nt][0] += exact_float(isum[nt][0] - q[nt][0]) * (d0 * s[nt][0]);
      acc[nt][1] += exact_float(isum[nt][1] - q[nt][1]) * (d0 * s[nt][1]);
      acc[nt][2] += exact_float(isum[nt][2] - q[nt][0]) * (d1 * s[nt][0]);
      acc[nt][3] += exact_float(isum[nt][3] - q[nt][1]) * (d1 * s[nt][1]);
    }
  }
}

// The K slices' partials of each tile of the CTA's unit, added in K order through shared
// memory (red[tile][slice][nt][e][lane]), then stored with the bias. Every thread calls it;
// red is free again only after a further barrier.
template <int NT>
__device__ __forceinline__ void stream_reduce_store(const Pq2LinearParams& p,
                                                    const float (&acc)[NT][4], float* red,
                                                    int unit, int tiles_per_cta, int ks_count) {
  constexpr int kOut = NT * 4 * 32;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * NT + nt) * 128 + e * 32 + lane] = acc[nt][e];
  __syncthreads();
  for (int o = tid; o < tiles_per_cta * kOut; o += blockDim.x) {
    const int tile = o / kOut, j = o % kOut;
    float sum = 0.f;
    for (int w = 0; w < ks_count; ++w) sum += red[(tile * ks_count + w) * kOut + j];
    const int ln = j & 31, e = (j >> 5) & 3, nt = j >> 7;
    const int row = (unit * tiles_per_cta + tile) * 16 + (ln >> 2) + 8 * (e >> 1);
    const int tok = 8 * nt + 2 * (ln & 3) + (e & 1);
    if (row < p.n && tok < p.m) {
      const float bias = p.bias ? load_as_float(p.bias, row, p.bias_dtype) : 0.f;
      store_out(p, static_cast<int64_t>(tok) * p.stride_o + row, sum + bias);
    }
  }
}

// The STREAM kernel: one unit (row tiles) a CTA (StreamWarp: each warp's tile and K slice).
template <int NT, int P>
__global__ void __launch_bounds__(512)
    pq2_mma_stream_kernel(const __grid_constant__ Pq2LinearParams p, int ks_count) {
  extern __shared__ __align__(16) char smem[];
  if (p.pdl) pdl_launch_dependents();
  const StreamWarp w(p.k / 128, ks_count);

  // 1. The first P groups' codes and scales, then the wait for the activation.
  StreamFrag<P> f;
  const StreamRows r = stream_start<P>(f, p, w, blockIdx.x);

  const StreamTokens<NT> tk(p, w.g, w.t);
  float acc[NT][4];
  fill(acc, 0.f);

  // 2. Group by group, P groups a pass.
  for (int base = w.lo; base < w.hi; base += P) {
    if (base != w.lo) stream_load<P>(f, r.c0, r.c1, r.s0, r.s1, base, w.hi);
    stream_compute<NT, P>(acc, f, p, tk, base, w.hi);
  }

  // 3. The K slices' partials of each tile, added in K order.
  stream_reduce_store<NT>(p, acc, reinterpret_cast<float*>(smem), blockIdx.x, w.tiles_per_cta,
                          ks_count);
}

// PERSIST (op variant 5): the STREAM kernel's warps and sums, with its CTAs resident for the
// whole matrix: CTA b takes the units (a CTA's row tiles) b, b + grid, ..., and each warp walks
// its (unit, pass) items issuing the next item's loads (P groups: half the STREAM kernel's, two
// sets in registers) before it computes the current one, so a warp keeps loads in flight
// across its tiles as the GEMV does across its rows (the STREAM kernel's CTAs run in waves,
// each issuing its loads once and waiting a full load latency before it computes; Nsight
// Compute put it at 22-30 % of DRAM throughput at M = 6 on the H200, latency-bound). The same
// int32 group sums, added in the order of its K slices.
template <int NT, int P>
__global__ void __launch_bounds__(512)
    pq2_mma_persist_kernel(const __grid_constant__ Pq2LinearParams p, int ks_count, int units) {
  extern __shared__ __align__(16) char smem[];
  if (p.pdl) pdl_launch_dependents();
  const StreamWarp w(p.k / 128, ks_count);
  // passes of the longest K slice: every warp of the CTA walks as many (a barrier ends a unit)
  const int groups = p.k / 128, passes = ((groups + ks_count - 1) / ks_count + P - 1) / P;
  float* red = reinterpret_cast<float*>(smem);

  // 1. The first item's codes and scales, then the wait for the activation.
  int unit = blockIdx.x, pass = 0;
  StreamFrag<P> f;
  StreamRows r = stream_start<P>(f, p, w, unit);

  const StreamTokens<NT> tk(p, w.g, w.t);
  float acc[NT][4];
  fill(acc, 0.f);

  // 2. Item by item (unit uniform in the CTA): the next item's loads, then the current one.
  while (unit < units) {
    int next_unit = unit, next_pass = pass + 1;
    if (next_pass == passes) next_unit += gridDim.x, next_pass = 0;
    const StreamRows nr = next_pass == 0 ? stream_rows(p, next_unit, w) : r;
    StreamFrag<P> nf;
    if (next_unit < units) {
      stream_load<P>(nf, nr.c0, nr.c1, nr.s0, nr.s1, w.lo + next_pass * P, w.hi);
    }
    stream_compute<NT, P>(acc, f, p, tk, w.lo + pass * P, w.hi);
    if (next_pass == 0) {  // the unit is complete: its tiles' K slices meet, then red is free
      stream_reduce_store<NT>(p, acc, red, unit, w.tiles_per_cta, ks_count);
      __syncthreads();
      fill(acc, 0.f);
    }
    f = nf;
    r = nr;
    unit = next_unit;
    pass = next_pass;
  }
}

// Groups a warp requests at once (5 registers each): 10 with one token tile, 8 with two (the
// 128 registers of a 512-thread CTA hold no more without spilling on sm_80).
template <int NT>
constexpr int stream_groups() {
  return NT == 1 ? 10 : 8;
}

// The K slices a 16-row tile is split into: the fewest (a power of two, at most 16) that
// leave a warp at most `pass` groups; and the tiles a CTA takes: up to 8 warps, fewer where
// the grid would be under two CTAs a multiprocessor.
void stream_geometry(int n, int k, int pass, int sm_count, int& ks, int& tiles) {
  const int groups = k / 128;
  ks = 1;
  while (ks < 16 && (groups + ks - 1) / ks > pass) ks <<= 1;
  tiles = ks >= 8 ? 1 : 8 / ks;
  const int row_tiles = (n + 15) / 16;
  while (tiles > 1 && (row_tiles + tiles - 1) / tiles < 2 * sm_count) tiles >>= 1;
}

// `target`: the most groups a warp's K slice should have (at most the pass, P).
template <int NT>
cudaError_t launch_stream(const Pq2LinearParams& p, int sm_count, int target,
                          cudaStream_t stream) {
  int ks = 1, tiles = 1;
  constexpr int kPass = stream_groups<NT>();
  stream_geometry(p.n, p.k, target < kPass ? target : kPass, sm_count, ks, tiles);
  const int warps = ks * tiles;
  const int bytes = warps * NT * 4 * 32 * 4;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(((p.n + 15) / 16 + tiles - 1) / tiles, 1, 1);
  cfg.blockDim = dim3(32 * warps, 1, 1);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(cfg, attr, p.pdl);
  return cudaLaunchKernelEx(&cfg, pq2_mma_stream_kernel<NT, kPass>, p, ks);
}

// Variant 5: the STREAM geometry with half its groups a pass (two sets of loads in registers),
// as many CTAs as stay resident (at most one per unit).
template <int NT>
cudaError_t launch_persist(const Pq2LinearParams& p, int sm_count, cudaStream_t stream) {
  constexpr int kPass = stream_groups<NT>() / 2;
  int ks = 1, tiles = 1;
  stream_geometry(p.n, p.k, kPass, sm_count, ks, tiles);
  const int warps = ks * tiles;
  const int bytes = warps * NT * 4 * 32 * 4;
  const int units = ((p.n + 15) / 16 + tiles - 1) / tiles;
  int per_sm = 0;
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, pq2_mma_persist_kernel<NT, kPass>, 32 * warps, bytes);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(min(units, max(per_sm, 1) * sm_count)), 1, 1);
  cfg.blockDim = dim3(32 * warps, 1, 1);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(cfg, attr, p.pdl);
  return cudaLaunchKernelEx(&cfg, pq2_mma_persist_kernel<NT, kPass>, p, ks, units);
}

// Rows a CTA owns: 128 where two CTAs a multiprocessor still fit, fewer (down to 16) where
// the grid would leave multiprocessors idle.
int pq2_mma_small_rows(int n, int k, int m, int sm_count, int smem_max) {
  const int nt = m <= 8 ? 1 : 2;
  const int target = min(kSmemTarget, smem_max);
  int rows = 128;
  while (rows > 16 && SmallSmem(k, rows, nt).bytes > target) rows >>= 1;
  while (rows > 16 && (n + rows - 1) / rows < sm_count) rows >>= 1;
  return rows;
}

}  // namespace

cudaError_t pq2_mma_small_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream,
                                 int variant) {
  if (p.n <= 0 || p.m <= 0) return cudaSuccess;
  if (p.m > kPq2SmallMaxM || p.k % 128 != 0 || variant < 0 || variant > 6) {
    return cudaErrorInvalidValue;
  }
  if (variant == 6) return pq2_mma_lean_launch(p, sm_count, stream);
  // 16-byte cp.async of code rows, 4-byte ones of scale pairs, 4-byte activation loads
  if (reinterpret_cast<uintptr_t>(p.codes) % 16 || (p.stride_c * 4) % 16 ||
      reinterpret_cast<uintptr_t>(p.scales) % 4 || p.stride_s % 2 ||
      reinterpret_cast<uintptr_t>(p.xq) % 4 || p.stride_x % 4) {
    return cudaErrorMisalignedAddress;
  }
  if (variant >= 2) {  // 16-byte activation loads at 32t of each group
    if (reinterpret_cast<uintptr_t>(p.xq) % 16 || p.stride_x % 16) {
      return cudaErrorMisalignedAddress;
    }
    if (variant == 4) return pq2_mma_bulk_launch(p, sm_count, stream);
    if (variant == 5) {
      return p.m <= 8 ? launch_persist<1>(p, sm_count, stream)
                      : launch_persist<2>(p, sm_count, stream);
    }
    const int target = variant == 3 ? 5 : 10;
    return p.m <= 8 ? launch_stream<1>(p, sm_count, target, stream)
                    : launch_stream<2>(p, sm_count, target, stream);
  }
  const int smem_max = min(kSmemMax, max_dynamic_smem_per_block());
  const int rows = pq2_mma_small_rows(p.n, p.k, p.m, sm_count, smem_max);
  const int nt = p.m <= 8 ? 1 : 2;
  const int bytes = SmallSmem(p.k, rows, nt).bytes;
  if (bytes > smem_max) return cudaErrorInvalidValue;  // K too long for 16 rows
  return variant == 1 ? launch_nt<true>(p, nt, rows / 16, bytes, stream)
                      : launch_nt<false>(p, nt, rows / 16, bytes, stream);
}

}  // namespace vllm_prism
