// PQ2 linear for M = 1..16 on int8 tensor cores with every multiprocessor's equal share of the
// weights requested through a ring of shared-memory stages (op variant 4 of mma_small.cuh,
// "mma_bulk_cuda"; opt-in: slower than mma_small_cuda / mma_stream_cuda on the H200, see
// benchmarks/results/pq2_linear_h200_notes.md). Torch-free; the torch op is in
// mma_small_op.cu.
//
// Why it was written: the other small-batch kernels give each CTA whole 16-row tiles, so on
// the Bonsai shapes some multiprocessors read more bytes than others (12288 rows over 132
// multiprocessors: 5.8 tiles each), and they either wait for all of a CTA's codes before
// computing (mma_small_cuda) or keep one burst of loads in flight per warp (mma_stream_cuda).
//
// Work split: one CTA a multiprocessor. The (16-row tile, 128-group) units of the matrix,
// tile-major, are cut into equal contiguous ranges, one a CTA, so every CTA reads the same
// number of bytes; only a CTA's first and last tile can be partial (their partial sums meet in
// a workspace and the last CTA to finish a tile adds them up in CTA order, like mma_int8.cu's
// K split). A CTA reads its tiles in stages of at most kStageGroups groups of one tile (the 16
// rows' codes and scale pairs, cp.async into one slot of a ring of `slots`). The first stages
// are requested before the grid-dependency wait (they do not depend on the previous kernel),
// and each consumed slot is refilled with the stage `slots` ahead.
//
// Compute: warp w takes groups a + w + kWarps i of each stage (i < kWarpGroups: independent
// MMA chains), their activation operands requested before the wait for the stage. The MMA's k
// index is permuted within each group as in mma_small.cu's STREAM variant (lane (g, t) reads
// its own 8 bytes of rows g and g + 8: bytes 8t .. 8t + 7 of the group's 32), so the A
// fragments are one shift and one AND of those bytes. At a tile's end the warps' partial sums
// meet in shared memory and are added in warp order: the result does not depend on timing.
//
// What bounds it (Nsight Compute, 12288x5120, M = 8): issue latency, not memory (10 % of DRAM
// throughput): ~300 warp instructions per 16 x 128 unit against ~44 for the dp4a GEMV (the
// per-stage barriers, waits and refills and each warp's fixed costs over only ~15 units a
// warp), stalled mostly on fixed-latency dependencies; the first tile's cross-CTA reduction
// (atomic, fences) in the middle of the ring costs ~5 us more (a probe with whole tiles a CTA:
// 17-18 against 22-23 us).
#include "mma_small.cuh"

#include "pq2_device.cuh"

namespace vllm_prism {
namespace {

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpGroups = 3;   // most groups a warp computes in a stage
constexpr int kStageGroups = kWarps * kWarpGroups;  // of one tile (K = 5120, 6144: a tile)
// Shared memory of a stage: [16 rows][kStageGroups x 32 bytes + 32 of padding] codes (the
// 8-byte reads of lanes g = 0..3 hit distinct banks), then [16 rows][kStageGroups + 2] fp16
// scales (4-byte pairs from the even group at or before the stage's first).
constexpr int kRowStride = kStageGroups * 32 + 32;
constexpr int kCodeBytes = 16 * kRowStride;
constexpr int kScaleRow = kStageGroups + 2;
constexpr int kSlotBytes = kCodeBytes + 16 * kScaleRow * 2;
constexpr int kMaxSlots = 12;            // cp.async groups a wait can name: at most 15
constexpr int kSmemBudget = 160 * 1024;  // leaves ~90 KiB of L1 for the activation
constexpr int kWsPerCta = 2 * 16 * kPq2SmallMaxM;  // fp32 partials: first and last tile

// The first unit of CTA c (32-bit: the launch checks units * ctas < 2^31).
__device__ inline int unit_start(int c, int units, int ctas) {
  return static_cast<int>(static_cast<unsigned>(c * units) / static_cast<unsigned>(ctas));
}

// The CTA that owns unit u (the last c with unit_start(c) <= u).
__device__ inline int unit_owner(int u, int units, int ctas) {
  int c = static_cast<int>(static_cast<unsigned>(u * ctas) / static_cast<unsigned>(units));
  while (c + 1 < ctas && unit_start(c + 1, units, ctas) <= u) ++c;
  while (c > 0 && unit_start(c, units, ctas) > u) --c;
  return c;
}

// A stage: groups [a, b) of tile t, chunk ci of the tile's share.
struct Stage {
  int t, ci, a, b;
};

// A CTA's share: tiles t0..t1, tile t0 from group g_first, tile t1 up to group g_end; each
// tile's share is read in chunks of at most kStageGroups groups.
struct Plan {
  int t0, t1, g_first, g_end, groups;

  __device__ Plan(int c, int n, int k) {
    groups = k / 128;
    const int units = (n + 15) / 16 * groups;
    const int u0 = unit_start(c, units, gridDim.x), u1 = unit_start(c + 1, units, gridDim.x);
    t0 = u0 / groups;
    g_first = u0 - t0 * groups;
    t1 = (u1 - 1) / groups;
    g_end = u1 - t1 * groups;
  }
  __device__ int ga(int t) const { return t == t0 ? g_first : 0; }  // tile t's groups here
  __device__ int gb(int t) const { return t == t1 ? g_end : groups; }
  __device__ bool partial(int t) const { return ga(t) > 0 || gb(t) < groups; }
  __device__ int chunks(int t) const { return (gb(t) - ga(t) + kStageGroups - 1) / kStageGroups; }
  __device__ Stage at(int t, int ci) const {
    const int lo = ga(t), len = gb(t) - lo, nc = chunks(t);
    return {t, ci, lo + ci * len / nc, lo + (ci + 1) * len / nc};
  }
  __device__ Stage begin() const { return at(t0, 0); }
  __device__ Stage next(const Stage& s) const {
    return s.ci + 1 < chunks(s.t) ? at(s.t, s.ci + 1) : at(s.t + 1, 0);
  }
  __device__ bool last_of_tile(const Stage& s) const { return s.ci + 1 == chunks(s.t); }
  __device__ int stages() const {
    if (t0 == t1) return chunks(t0);
    return chunks(t0) + chunks(t1) + (t1 - t0 - 1) * ((groups + kStageGroups - 1) / kStageGroups);
  }
};

// Requests stage `st` (its tile's codes and scale pairs of groups [a, b)) into `slot`: thread
// (r, l) of the CTA copies row r's 16-byte pieces l, l + kLanes, ... and its scale pairs alike.
__device__ __forceinline__ void issue_stage(const Pq2LinearParams& p, const Stage& st,
                                            char* slot, int tid) {
  constexpr int kLanes = kThreads / 16;  // threads a row
  const int r = tid / kLanes, l = tid % kLanes;
  const int row = min(16 * st.t + r, p.n - 1);
  const char* src = reinterpret_cast<const char*>(p.codes + row * p.stride_c) + 32 * st.a;
  char* dst = slot + r * kRowStride;
  const int pieces = 2 * (st.b - st.a);
  for (int i = l; i < pieces; i += kLanes) cp_async16(dst + 16 * i, src + 16 * i);
  const int a2 = st.a & ~1, pairs = (st.b - a2 + 1) / 2;
  const uint16_t* ssrc = p.scales + row * p.stride_s + a2;
  char* sdst = slot + kCodeBytes + r * kScaleRow * 2;
  for (int q = l; q < pairs; q += kLanes) cp_async4(sdst + 4 * q, ssrc + 2 * q);
}

// A warp's activation operands of one group: B fragments of each token tile (32 bytes at 32t),
// and the group's scale and int32 sum of this lane's two C tokens.
template <int NT>
struct BFrag {
  uint4 x[NT][2];
  float s[NT][2];
  int32_t q[NT][2];
};

// This lane's activation pointers: B rows (tokens g + 8 nt, at 32 t4) and its C tokens' group
// scales and sums (tokens 8 nt + 2 t4 and + 1); past M, token M - 1 (not stored).
template <int NT>
struct ActPtrs {
  const int8_t* x[NT];
  const float* s[NT][2];
  const int32_t* q[NT][2];

  __device__ ActPtrs(const Pq2LinearParams& p, int g, int t4) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      x[nt] = p.xq + min(8 * nt + g, p.m - 1) * p.stride_x + 32 * t4;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int tok = min(8 * nt + 2 * t4 + c, p.m - 1);
        s[nt][c] = p.sx + tok * p.stride_g;
        q[nt][c] = p.qsum + tok * p.stride_g;
      }
    }
  }
};

template <int NT>
__device__ __forceinline__ void load_bfrag(BFrag<NT>& f, const ActPtrs<NT>& a, int grp) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint4* xb = reinterpret_cast<const uint4*>(a.x[nt] + 128 * grp);
    f.x[nt][0] = __ldg(xb);
    f.x[nt][1] = __ldg(xb + 1);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      f.s[nt][c] = __ldg(a.s[nt][c] + grp);
      f.q[nt][c] = __ldg(a.q[nt][c] + grp);
    }
  }
}

// acc += group `grp` of the stage in `slot` (rows g, g + 8 of the tile) times the tokens.
template <int NT>
__device__ __forceinline__ void mma_group(float (&acc)[NT][4], const char* slot,
                                          const Stage& st, int grp, const BFrag<NT>& f, int g,
                                          int t4) {
  const char* rows = slot + g * kRowStride + (grp - st.a) * 32 + 8 * t4;
  const uint2 w0 = *reinterpret_cast<const uint2*>(rows);
  const uint2 w1 = *reinterpret_cast<const uint2*>(rows + 8 * kRowStride);
  const uint16_t* sc =
      reinterpret_cast<const uint16_t*>(slot + kCodeBytes) + g * kScaleRow + grp - (st.a & ~1);
  const float d0 = __half2float(__ushort_as_half(sc[0]));
  const float d1 = __half2float(__ushort_as_half(sc[8 * kScaleRow]));
  int32_t isum[NT][4];
  mma_group_permuted<NT>(isum, w0, w1, f.x);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    acc[nt][0] += exact_float(isum[nt][0] - f.q[nt][0]) * (d0 * f.s[nt][0]);
    acc[nt][1] += exact_float(isum[nt][1] - f.q[nt][1]) * (d0 * f.s[nt][1]);
    acc[nt][2] += exact_float(isum[nt][2] - f.q[nt][0]) * (d1 * f.s[nt][0]);
    acc[nt][3] += exact_float(isum[nt][3] - f.q[nt][1]) * (d1 * f.s[nt][1]);
  }
}

// Stores tile t's sums (red: [warp][nt][e][lane], added in warp order) or, for a tile shared
// with other CTAs, parks them in the workspace; the last of a shared tile's CTAs adds the
// partials in CTA order and stores.
template <int NT>
__device__ void finish_tile(const Pq2LinearParams& p, const Plan& P, int t, const float* red,
                            int* flag, int tid) {
  constexpr int kOut = NT * 4 * 32;  // partials a warp holds
  const bool shared = P.partial(t);
  for (int o = tid; o < kOut; o += kThreads) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += red[w * kOut + o];
    const int nt = o >> 7, e = (o >> 5) & 3, ln = o & 31;
    const int r = (ln >> 2) + 8 * (e >> 1), tok = 8 * nt + 2 * (ln & 3) + (e & 1);
    if (shared) {
      const int slot = t == P.t0 ? 0 : 1;
      p.workspace[(blockIdx.x * 2 + slot) * (16 * kPq2SmallMaxM) + r * kPq2SmallMaxM + tok] = sum;
    } else if (16 * t + r < p.n && tok < p.m) {
      const int row = 16 * t + r;
      const float bias = p.bias ? load_as_float(p.bias, row, p.bias_dtype) : 0.f;
      store_out(p, static_cast<int64_t>(tok) * p.stride_o + row, sum + bias);
    }
  }
  if (!shared) return;
  const int units = (p.n + 15) / 16 * P.groups;
  const int c_lo = unit_owner(t * P.groups, units, gridDim.x);
  const int c_hi = unit_owner((t + 1) * P.groups - 1, units, gridDim.x);
  __threadfence();
  __syncthreads();
  if (tid == 0) *flag = atomicAdd(p.counters + t, 1) == c_hi - c_lo;
  __syncthreads();
  if (!*flag) return;
  __threadfence();
  for (int o = tid; o < 16 * p.m; o += kThreads) {
    const int r = o / p.m, tok = o - r * p.m, row = 16 * t + r;
    float sum = 0.f;
    for (int c = c_lo; c <= c_hi; ++c) {
      const int first_tile = unit_start(c, units, gridDim.x) / P.groups;
      const int slot = t == first_tile ? 0 : 1;
      sum += __ldcg(p.workspace + (c * 2 + slot) * (16 * kPq2SmallMaxM) + r * kPq2SmallMaxM +
                    tok);
    }
    if (row < p.n) {
      const float bias = p.bias ? load_as_float(p.bias, row, p.bias_dtype) : 0.f;
      store_out(p, static_cast<int64_t>(tok) * p.stride_o + row, sum + bias);
    }
  }
  if (tid == 0) p.counters[t] = 0;
}

template <int NT>
__global__ void __launch_bounds__(kThreads, 1)
    pq2_mma_bulk_kernel(const __grid_constant__ Pq2LinearParams p, int slots) {
  extern __shared__ __align__(16) char smem[];
  __shared__ int flag;
  if (p.pdl) pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const Plan P(blockIdx.x, p.n, p.k);
  const int nst = P.stages();
  float* red = reinterpret_cast<float*>(smem + slots * kSlotBytes);

  // 1. The first `slots` stages: independent of the previous kernel. One commit group a stage
  //    (empty past the last), so stage s is always the (s + 1)-th group of this thread.
  Stage is = P.begin();
  for (int s = 0; s < slots; ++s) {
    if (s < nst) {
      issue_stage(p, is, smem + s * kSlotBytes, tid);
      is = P.next(is);
    }
    cp_async_commit();
  }
  if (p.pdl) pdl_wait();  // the activation is complete past here

  const ActPtrs<NT> ap(p, g, t4);
  float acc[NT][4];
  fill(acc, 0.f);

  Stage st = P.begin();
  for (int s = 0; s < nst; ++s) {
    const char* slot = smem + (s % slots) * kSlotBytes;
    // 2. Groups a + warp + kWarps i (i < kWarpGroups) of the stage: their activation operands
    //    are requested before the wait for the stage; independent MMA chains.
    BFrag<NT> f[kWarpGroups];
#pragma unroll
    for (int i = 0; i < kWarpGroups; ++i) {
      const int grp = st.a + warp + kWarps * i;
      if (grp < st.b) load_bfrag<NT>(f[i], ap, grp);
    }
    cp_async_wait_at_most(slots - 1);
    __syncthreads();  // every thread's copies of stage s have landed
#pragma unroll
    for (int i = 0; i < kWarpGroups; ++i) {
      const int grp = st.a + warp + kWarps * i;
      if (grp < st.b) mma_group<NT>(acc, slot, st, grp, f[i], g, t4);
    }
    // 3. At a tile's end the warps' sums go to shared memory: red[warp][nt][e][lane].
    const bool tile_end = P.last_of_tile(st);
    if (tile_end) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          red[(warp * NT + nt) * 128 + e * 32 + lane] = acc[nt][e];
          acc[nt][e] = 0.f;
        }
    }
    __syncthreads();  // slot s is consumed; the tile's sums are in `red`
    if (tile_end) finish_tile<NT>(p, P, st.t, red, &flag, tid);
    if (s + slots < nst) {
      issue_stage(p, is, smem + (s % slots) * kSlotBytes, tid);
      is = P.next(is);
    }
    cp_async_commit();
    st = P.next(st);
  }
}

int bulk_ctas(int n, int k, int sm_count) {
  const int64_t units = static_cast<int64_t>((n + 15) / 16) * (k / 128);
  const int64_t by_size = (units + 7) / 8;  // at least 8 groups (one a warp) each
  return static_cast<int>(by_size < sm_count ? (by_size > 0 ? by_size : 1) : sm_count);
}

int red_bytes(int nt) { return kWarps * nt * 4 * 32 * 4; }

}  // namespace

int pq2_mma_bulk_workspace_floats(int n, int k, int sm_count) {
  return bulk_ctas(n, k, sm_count) * kWsPerCta;
}

cudaError_t pq2_mma_bulk_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream) {
  if (p.workspace == nullptr || p.counters == nullptr) return cudaErrorInvalidValue;
  const int64_t units = static_cast<int64_t>((p.n + 15) / 16) * (p.k / 128);
  if (units * (sm_count + 1) >= (int64_t{1} << 31)) return cudaErrorInvalidValue;  // 32-bit plan
  const int nt = p.m <= 8 ? 1 : 2;
  const int smem_max = max_dynamic_smem_per_block();
  const int budget = (kSmemBudget < smem_max ? kSmemBudget : smem_max) - red_bytes(nt);
  int slots = budget / kSlotBytes;
  if (slots > kMaxSlots) slots = kMaxSlots;
  if (slots < 2) return cudaErrorInvalidValue;
  const int bytes = slots * kSlotBytes + red_bytes(nt);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(bulk_ctas(p.n, p.k, sm_count), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(cfg, attr, p.pdl);
  if (nt == 1) {
    cudaError_t err = cudaFuncSetAttribute(pq2_mma_bulk_kernel<1>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return err;
    return cudaLaunchKernelEx(&cfg, pq2_mma_bulk_kernel<1>, p, slots);
  }
  cudaError_t err = cudaFuncSetAttribute(pq2_mma_bulk_kernel<2>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  return cudaLaunchKernelEx(&cfg, pq2_mma_bulk_kernel<2>, p, slots);
}

}  // namespace vllm_prism
