// PQ2 linear for M = 1..8 on int8 tensor cores at the GEMV's occupancy (op variant 6 of
// pq2_mma_small_int8, "mma_lean_cuda"; see mma_small.cuh). Torch-free; the torch op is in
// mma_small_op.cu.
//
// Why: the streaming small-batch kernel (mma_small.cu STREAM) holds up to 10 groups of codes
// a lane in registers (125 registers, 16 warps a multiprocessor). Its CTAs run in waves whose
// phases stay locked: every warp issues its loads, every warp waits a full load latency with
// nothing to compute, then every warp computes with no loads in flight (Nsight Compute on the
// H200: 22-30 % of DRAM throughput at M = 6, long-scoreboard stalls). The dp4a GEMV reaches
// 0.7-0.84 of a streaming read's speed with short passes (5 chunks a lane) and 32 resident
// warps a multiprocessor, whose phases drift apart. This kernel is the tensor-core kernel on
// the GEMV's recipe:
//   - a warp owns one 16-row tile and a K slice of whole units of four 128-groups; a pass is
//     one unit (lane (g, t): 8 bytes of row g and of row g + 8 per group, as STREAM, and the
//     four groups' fp16 scales of each row in one 8-byte load);
//   - the registers are capped (REGS, __maxnreg__) so that 21 (96 registers) or 16 (128)
//     warps stay resident; with PREFETCH the next unit's loads are issued before the current
//     one is computed (two sets of codes in registers);
//   - KS warps split a tile's K and TILES tiles share a CTA (runtime geometry); the K slices'
//     partial sums meet in shared memory and are added in K order, so the result does not
//     depend on timing.
// The MMA's k index is permuted within each group as in STREAM (mma_group_permuted), so each
// group is one exact int32 sum, offset by the activation's group sum and scaled in fp32.
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "mma_small.cuh"

#include "pq2_device.cuh"

namespace vllm_prism {
namespace {

constexpr int kLeanUnit = 4;  // 128-groups a unit (a pass): one 8-byte load of scales a row

// 8 bytes, read-only, not kept in L1 (each is read once).
__device__ __forceinline__ uint2 lean_load8(const char* ptr) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n"
               : "=r"(v.x), "=r"(v.y) : "l"(ptr));
  return v;
}

// One lane's loads of one unit: 8 bytes of codes of rows g and g + 8 for each of its four
// groups, and the four groups' fp16 scales of each row.
struct LeanFrag {
  uint2 w0[kLeanUnit], w1[kLeanUnit];
  uint2 d0, d1;
};

// A lane's rows: byte offsets of its codes (row g, row g + 8, at 8t) and of the rows' scales
// from the planes' starts (32-bit: the launch checks that the planes are under 2 GiB).
struct LeanRows {
  int c0, c1, s0, s1;
};

__device__ __forceinline__ void lean_load(LeanFrag& f, const Pq2LinearParams& p,
                                          const LeanRows& r, int unit) {
  const char* codes = reinterpret_cast<const char*>(p.codes) + 32 * kLeanUnit * unit;
#pragma unroll
  for (int i = 0; i < kLeanUnit; ++i) {
    f.w0[i] = lean_load8(codes + r.c0 + 32 * i);
    f.w1[i] = lean_load8(codes + r.c1 + 32 * i);
  }
  const char* scales = reinterpret_cast<const char*>(p.scales) + 2 * kLeanUnit * unit;
  f.d0 = lean_load8(scales + r.s0);
  f.d1 = lean_load8(scales + r.s1);
}

// The fp16 scale of group i (0..3) of a unit's 8-byte scale load, as fp32.
__device__ __forceinline__ float lean_scale(const uint2& d, int i) {
  const uint32_t w = i < 2 ? d.x : d.y;
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> (16 * (i & 1)))));
}

// This lane's tokens as offsets: its B column g (32 bytes at 32t of a group) and its C
// columns 2t and 2t + 1 (past M: token M - 1, not stored).
struct LeanTokens {
  int x, s0, s1;
};

// Adds unit `unit` (its codes and scales in f) to the lane's sums.
__device__ __forceinline__ void lean_compute(float (&acc)[4], const LeanFrag& f,
                                             const Pq2LinearParams& p, const LeanTokens& tk,
                                             int unit) {
  const int8_t* xb = p.xq + tk.x + 128 * kLeanUnit * unit;
  const int grp0 = kLeanUnit * unit;
#pragma unroll
  for (int i = 0; i < kLeanUnit; ++i) {
    uint4 bx[1][2];
    bx[0][0] = __ldg(reinterpret_cast<const uint4*>(xb + 128 * i));
    bx[0][1] = __ldg(reinterpret_cast<const uint4*>(xb + 128 * i + 16));
    const float s0 = __ldg(p.sx + tk.s0 + grp0 + i), s1 = __ldg(p.sx + tk.s1 + grp0 + i);
    const int32_t q0 = __ldg(p.qsum + tk.s0 + grp0 + i), q1 = __ldg(p.qsum + tk.s1 + grp0 + i);
    int32_t isum[1][4];
    mma_group_permuted<1>(isum, f.w0[i], f.w1[i], bx);
    const float d0 = lean_scale(f.d0, i), d1 = lean_scale(f.d1, i);
    acc[0] += exact_float(isum[0][0] - q0) * (d0 * s0);
    acc[1] += exact_float(isum[0][1] - q1) * (d0 * s1);
    acc[2] += exact_float(isum[0][2] - q0) * (d1 * s0);
    acc[3] += exact_float(isum[0][3] - q1) * (d1 * s1);
  }
}

template <int REGS, bool PREFETCH>
__global__ void __maxnreg__(REGS)
    pq2_mma_lean_kernel(const __grid_constant__ Pq2LinearParams p, int ks) {
  extern __shared__ __align__(16) float red[];  // [warp][e][lane]
  if (p.pdl) pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tiles = (blockDim.x >> 5) / ks, slice = warp % ks;
  const int units = p.k / (128 * kLeanUnit);
  const int lo = slice * units / ks, hi = (slice + 1) * units / ks;
  const int row0 = (static_cast<int>(blockIdx.x) * tiles + warp / ks) * 16;
  const int r0 = min(row0 + g, p.n - 1), r1 = min(row0 + g + 8, p.n - 1);
  const int code_row = 4 * static_cast<int>(p.stride_c);
  const int scale_row = 2 * static_cast<int>(p.stride_s);
  const LeanRows rows{r0 * code_row + 8 * t, r1 * code_row + 8 * t, r0 * scale_row,
                      r1 * scale_row};

  // 1. The first unit's codes and scales: independent of the previous kernel.
  LeanFrag f;
  if (lo < hi) lean_load(f, p, rows, lo);
  if (p.pdl) pdl_wait();  // the activation is complete past here

  const int sx_row = static_cast<int>(p.stride_g);
  const LeanTokens tk{min(g, p.m - 1) * static_cast<int>(p.stride_x) + 32 * t,
                      min(2 * t, p.m - 1) * sx_row, min(2 * t + 1, p.m - 1) * sx_row};
  float acc[4] = {0.f, 0.f, 0.f, 0.f};

  // 2. Unit by unit.
  for (int u = lo; u < hi; ++u) {
    if constexpr (PREFETCH) {
      LeanFrag nf;
      if (u + 1 < hi) lean_load(nf, p, rows, u + 1);
      lean_compute(acc, f, p, tk, u);
      f = nf;
    } else {
      lean_compute(acc, f, p, tk, u);
      if (u + 1 < hi) lean_load(f, p, rows, u + 1);
    }
  }

  // 3. The K slices' partial sums of each tile, added in K order, stored with the bias.
#pragma unroll
  for (int e = 0; e < 4; ++e) red[(warp * 4 + e) * 32 + lane] = acc[e];
  __syncthreads();
  for (int o = threadIdx.x; o < tiles * 128; o += blockDim.x) {
    const int tile = o >> 7, j = o & 127;
    float sum = 0.f;
    for (int w = 0; w < ks; ++w) sum += red[(tile * ks + w) * 128 + j];
    const int ln = j & 31, e = j >> 5;
    const int row = (static_cast<int>(blockIdx.x) * tiles + tile) * 16 + (ln >> 2) + 8 * (e >> 1);
    const int tok = 2 * (ln & 3) + (e & 1);
    if (row < p.n && tok < p.m) {
      const float bias = p.bias ? load_as_float(p.bias, row, p.bias_dtype) : 0.f;
      store_out(p, static_cast<int64_t>(tok) * p.stride_o + row, sum + bias);
    }
  }
}

using LeanKernel = void (*)(Pq2LinearParams, int);

// The compiled register caps: 96 with the prefetch (21 warps a multiprocessor; without it the
// same cap spills), 128 either way (16 warps).
LeanKernel lean_kernel(int regs, bool prefetch) {
  if (regs == 96 && prefetch) return &pq2_mma_lean_kernel<96, true>;
  if (regs == 128) {
    return prefetch ? &pq2_mma_lean_kernel<128, true> : &pq2_mma_lean_kernel<128, false>;
  }
  return nullptr;
}

// CTAs of `warps` warps that stay resident on a multiprocessor for the kernel of `regs`
// registers (with the prefetch), from the occupancy calculator (CTAs of an odd warp count can
// fit fewer than the register file suggests), read once per device.
int lean_ctas_per_sm(int regs, int warps) {
  static int cached[64][2][33] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64 || warps < 1 || warps > 32) {
    return 0;
  }
  int& v = cached[dev][regs == 128][warps];
  if (v == 0) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, lean_kernel(regs, true), 32 * warps,
                                                      warps * 4 * 32 * 4) != cudaSuccess) {
      return 0;
    }
    v = n > 0 ? n : -1;
  }
  return v > 0 ? v : 0;
}

}  // namespace

// The geometry timed best on the H200 (benchmarks/results/pq2_small_sweep_h200.md): with the
// prefetch, the register cap and the (K slices, tiles a CTA) that keep the most warps resident
// in a single wave of CTAs, with at least two units a warp (every layer shape's winner in the
// sweep was a single-wave one: a second, partial wave costs more than the warps it adds), 128
// registers over 96 where both keep as many warps (its code stalls less); where nothing fits
// one wave (the LM head), 96 registers, 2 slices and 2 tiles.
LeanConfig pq2_mma_lean_default_config(int n, int k, int sm_count) {
  const int units = k / (128 * kLeanUnit), tiles = (n + 15) / 16;
  LeanConfig best;
  best.regs = 96;
  best.prefetch = true;
  best.ks = units < 2 ? units : 2;
  best.tiles = 2;
  double best_active = 0;
  for (int regs : {96, 128}) {
    for (int ks = 1; ks <= units && ks <= 16; ++ks) {
      if (units < 2 * ks && ks > 1) break;  // at least two units a warp
      for (int t = 1; t <= 2; ++t) {
        const int w = ks * t;
        const int64_t slots = static_cast<int64_t>(lean_ctas_per_sm(regs, w)) * sm_count;
        const int64_t grid = (tiles + t - 1) / t;
        if (grid > slots) continue;  // more than one wave (or none fits)
        const double active = static_cast<double>(grid) * w / sm_count;  // warps an SM
        const bool tie = active > best_active - 1e-9 && active < best_active + 1e-9;
        if (active > best_active + 1e-9 ||
            (tie && (regs > best.regs || (regs == best.regs && t > best.tiles)))) {
          best_active = active;
          best.regs = regs;
          best.ks = ks;
          best.tiles = t;
        }
      }
    }
  }
  return best;
}

cudaError_t pq2_mma_lean_launch_config(const Pq2LinearParams& p, const LeanConfig& cfg,
                                       cudaStream_t stream) {
  if (p.n <= 0 || p.m <= 0) return cudaSuccess;
  const int units = p.k / (128 * kLeanUnit);
  if (p.m > kPq2LeanMaxM || p.k % (128 * kLeanUnit) != 0 || cfg.ks < 1 || cfg.ks > units ||
      cfg.tiles < 1 || cfg.ks * cfg.tiles > 32) {
    return cudaErrorInvalidValue;
  }
  // 32-bit offsets into the planes and the activation
  if (static_cast<int64_t>(p.n) * p.stride_c * 4 >= (int64_t{1} << 31) ||
      static_cast<int64_t>(p.n) * p.stride_s * 2 >= (int64_t{1} << 31) ||
      static_cast<int64_t>(p.m) * p.stride_x >= (int64_t{1} << 31) ||
      static_cast<int64_t>(p.m) * p.stride_g >= (int64_t{1} << 31)) {
    return cudaErrorInvalidValue;
  }
  // 8-byte code and scale loads (four fp16 scales of a unit at once), 16-byte activation loads
  if (reinterpret_cast<uintptr_t>(p.codes) % 16 || (p.stride_c * 4) % 16 ||
      reinterpret_cast<uintptr_t>(p.scales) % 8 || p.stride_s % 4 ||
      reinterpret_cast<uintptr_t>(p.xq) % 16 || p.stride_x % 16) {
    return cudaErrorMisalignedAddress;
  }
  const LeanKernel fn = lean_kernel(cfg.regs, cfg.prefetch);
  if (fn == nullptr) return cudaErrorInvalidValue;
  const int warps = cfg.ks * cfg.tiles;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(((p.n + 15) / 16 + cfg.tiles - 1) / cfg.tiles), 1, 1);
  lc.blockDim = dim3(32 * warps, 1, 1);
  lc.dynamicSmemBytes = warps * 4 * 32 * 4;
  lc.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(lc, attr, p.pdl);
  return cudaLaunchKernelEx(&lc, fn, p, cfg.ks);
}

namespace {

// pq2_mma_lean_default_config per (device, N, K, multiprocessors), searched once: a model has a
// handful of linear shapes, and eager or piecewise steps launch each many times a step.
LeanConfig cached_default_config(int n, int k, int sm_count) {
  if (n >= (1 << 20) || k >= (1 << 20)) return pq2_mma_lean_default_config(n, k, sm_count);
  static std::mutex mu;
  static std::unordered_map<uint64_t, LeanConfig> cache;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
  const uint64_t key = (static_cast<uint64_t>(dev & 0xff) << 56) |
                       (static_cast<uint64_t>(sm_count & 0xffff) << 40) |
                       (static_cast<uint64_t>(n) << 20) | static_cast<uint64_t>(k);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const LeanConfig cfg = pq2_mma_lean_default_config(n, k, sm_count);
  cache.emplace(key, cfg);
  return cfg;
}

}  // namespace

cudaError_t pq2_mma_lean_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream) {
  return pq2_mma_lean_launch_config(p, cached_default_config(p.n, p.k, sm_count), stream);
}

}  // namespace vllm_prism
