// PQ2 GEMV for M = 1..4 (see gemv_int8.cuh). Torch-free; the torch op is in gemv_int8_op.cu.
//
// A streaming design: the weights go global -> registers, 16 bytes (one 64-weight chunk) per
// load, and the loads of a whole row are issued at once, so with ~32 warps a multiprocessor
// keeps ~100 KiB of weights in flight without shared-memory staging or CTA barriers. LANES
// lanes of a warp (8, 16 or 32) share one row, lane l taking the chunks l, l + LANES, ... (at
// most CMAX of them in registers: longer rows take several passes), so a warp reduces
// 32 / LANES rows at a time. Warps walk their rows grid-stride; with PREFETCH the next
// row's (or pass's) loads are issued before the current one is computed. The first loads of
// every warp are issued before the grid-dependency wait (programmatic dependent launch): they
// do not depend on the producer of the activation.
//
// The M int8 activation rows are staged in shared memory once per CTA, piece-major ([4][K/64]
// of 16 bytes a row: lanes reading consecutive chunks hit distinct banks), with the int32 sum
// of each 64-chunk and the fp32 scale of each 128-group; a chunk of codes in registers is
// decoded once for all M rows. Per chunk and row the integer dot (16 dp4a) minus
// the chunk's activation sum is exact; it is scaled by the weight's and the activation's
// group scales in fp32 and summed in chunk order per lane, then over the lanes by a fixed
// shuffle tree: the result does not depend on timing.
#include "gemv_int8.cuh"

#include <algorithm>

#include "pq2_device.cuh"
#include "producer_device.cuh"

namespace vllm_prism {
namespace {

constexpr uint32_t kMask = 0x03030303u;
constexpr int kThreads = 256;
// Resident 256-thread CTAs the compiler sizes the registers for (__launch_bounds__); 1 leaves
// it free. Other values are for the kernel sweep's register experiments (-D...).
#ifndef PQ2_GEMV_MIN_BLOCKS
#define PQ2_GEMV_MIN_BLOCKS 1
#endif

// Byte offsets of a CTA's dynamic shared memory.
struct GemvSmem {
  int g64, g128, x, xsum, sx, bytes;

  __host__ __device__ GemvSmem(int k, int m) {
    g64 = k / 64;
    g128 = (k + 127) / 128;
    x = 0;                                // int4 [m][4][g64]
    xsum = x + m * k;                     // int32 [m][g64]
    sx = xsum + align16(4 * m * g64);     // fp32 [m][g128]
    bytes = sx + align16(4 * m * g128);
  }
};

// 16 bytes of codes, read-only, by the cache policy HINT: 0 default (L1 allocate), 1 no L1
// allocation, 2 no L1 allocation and a 256-byte L2 prefetch.
template <int HINT>
__device__ __forceinline__ uint4 load_codes(const int32_t* ptr) {
  uint4 v;
  if constexpr (HINT == 0) {
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  } else if constexpr (HINT == 1) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  }
  return v;
}

// One lane's share of one row pass: CMAX chunks of codes and their fp16 scales.
template <int CMAX>
struct Frag {
  uint4 w[CMAX];
  uint16_t d[CMAX];
};

// Where a warp is: its row group (32 / LANES rows) and pass over K.
struct Cursor {
  int rg, pass;
};

template <int LANES, int CMAX, int HINT>
__device__ __forceinline__ void load_frag(Frag<CMAX>& f, const Pq2LinearParams& p, Cursor c,
                                          int hl, int sub, int g64) {
  const int row = min(c.rg * (32 / LANES) + sub, p.n - 1);
  const int32_t* crow = p.codes + static_cast<int64_t>(row) * p.stride_c;
  const uint16_t* srow = p.scales + static_cast<int64_t>(row) * p.stride_s;
  const int g0 = c.pass * (LANES * CMAX) + hl;
#pragma unroll
  for (int i = 0; i < CMAX; ++i) {
    const int g = g0 + LANES * i;
    if (g < g64) {
      f.w[i] = load_codes<HINT>(crow + 4 * g);
      f.d[i] = __ldg(srow + (g >> 1));
    }
  }
}

// Adds one lane's share of a row pass to the sums of the M activation rows.
template <int LANES, int CMAX, int M>
__device__ __forceinline__ void dot_frag(float (&acc)[M], const Frag<CMAX>& f, Cursor c, int hl,
                                         const GemvSmem& L, const char* smem) {
  const int g0 = c.pass * (LANES * CMAX) + hl;
#pragma unroll
  for (int i = 0; i < CMAX; ++i) {
    const int g = g0 + LANES * i;
    if (g < L.g64) {
      const uint32_t words[4] = {f.w[i].x, f.w[i].y, f.w[i].z, f.w[i].w};
      const float d = __half2float(__ushort_as_half(f.d[i]));
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const int4* xs = reinterpret_cast<const int4*>(smem + L.x) + m * 4 * L.g64;
        int dot = -reinterpret_cast<const int*>(smem + L.xsum)[m * L.g64 + g];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int4 x = xs[j * L.g64 + g];
          const uint32_t cw = words[j];
          dot = __dp4a(static_cast<int>(cw & kMask), x.x, dot);
          dot = __dp4a(static_cast<int>((cw >> 2) & kMask), x.y, dot);
          dot = __dp4a(static_cast<int>((cw >> 4) & kMask), x.z, dot);
          dot = __dp4a(static_cast<int>((cw >> 6) & kMask), x.w, dot);
        }
        const float sx = reinterpret_cast<const float*>(smem + L.sx)[m * L.g128 + (g >> 1)];
        acc[m] += exact_float(dot) * (d * sx);
      }
    }
  }
}

// Step 3 of both kernels: the warp's row groups (pass by pass for long rows) from its first
// one, whose codes are in `f`, against the activation rows staged in shared memory.
template <int LANES, int CMAX, int HINT, bool PREFETCH, int M>
__device__ __forceinline__ void gemv_rows(const Pq2LinearParams& p, const GemvSmem& L,
                                          const char* smem, Cursor cur, Frag<CMAX>& f) {
  constexpr int kRowsPerWarp = 32 / LANES;
  const int lane = threadIdx.x & 31;
  const int hl = lane % LANES, sub = lane / LANES;
  const int stride = gridDim.x * (blockDim.x >> 5);  // warps of the grid
  const int groups = (p.n + kRowsPerWarp - 1) / kRowsPerWarp;
  const int passes = (L.g64 + LANES * CMAX - 1) / (LANES * CMAX);
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  while (cur.rg < groups) {
    Cursor next{cur.rg, cur.pass + 1};
    if (next.pass == passes) next = Cursor{cur.rg + stride, 0};
    if constexpr (PREFETCH) {
      Frag<CMAX> nf;
      if (next.rg < groups) load_frag<LANES, CMAX, HINT>(nf, p, next, hl, sub, L.g64);
      dot_frag<LANES, CMAX, M>(acc, f, cur, hl, L, smem);
      f = nf;
    } else {
      dot_frag<LANES, CMAX, M>(acc, f, cur, hl, L, smem);
      if (next.rg < groups) load_frag<LANES, CMAX, HINT>(f, p, next, hl, sub, L.g64);
    }
    if (next.pass == 0) {  // the row is complete: reduce over its LANES lanes
      const int row = cur.rg * kRowsPerWarp + sub;
      const float b = p.bias && row < p.n ? load_as_float(p.bias, row, p.bias_dtype) : 0.f;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float v = acc[m];
#pragma unroll
        for (int o = LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (hl == 0 && row < p.n) store_out(p, m * p.stride_o + row, v + b);
        acc[m] = 0.f;
      }
    }
    cur = next;
  }
}

template <int LANES, int CMAX, int HINT, bool PREFETCH, int M>
__global__ void __launch_bounds__(kThreads, PQ2_GEMV_MIN_BLOCKS)
    pq2_gemv_int8_kernel(const __grid_constant__ Pq2LinearParams p) {
  extern __shared__ __align__(16) char smem[];
  if (p.pdl) pdl_launch_dependents();
  constexpr int kRowsPerWarp = 32 / LANES;
  const GemvSmem L(p.k, M);
  const int tid = threadIdx.x, lane = tid & 31;
  const int hl = lane % LANES, sub = lane / LANES;
  const int groups = (p.n + kRowsPerWarp - 1) / kRowsPerWarp;

  // 1. The first row's codes: independent of the previous kernel.
  const Cursor cur{static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x >> 5) + (tid >> 5),
                   0};
  Frag<CMAX> f;
  if (cur.rg < groups) load_frag<LANES, CMAX, HINT>(f, p, cur, hl, sub, L.g64);
  if (p.pdl) pdl_wait();  // the activation is complete past here

  // 2. The activation rows, piece-major, with their 64-chunk sums and 128-group scales.
  for (int i = tid; i < M * L.g64; i += blockDim.x) {
    const int m = i / L.g64, g = i - m * L.g64;
    const int4* xg = reinterpret_cast<const int4*>(p.xq + m * p.stride_x) + 4 * g;
    int4* xs = reinterpret_cast<int4*>(smem + L.x) + m * 4 * L.g64;
    int s = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int4 v = __ldg(xg + j);
      xs[j * L.g64 + g] = v;
      s = __dp4a(0x01010101, v.x, s);
      s = __dp4a(0x01010101, v.y, s);
      s = __dp4a(0x01010101, v.z, s);
      s = __dp4a(0x01010101, v.w, s);
    }
    reinterpret_cast<int*>(smem + L.xsum)[i] = s;
  }
  for (int i = tid; i < M * L.g128; i += blockDim.x) {
    const int m = i / L.g128;
    reinterpret_cast<float*>(smem + L.sx)[i] = __ldg(p.sx + m * p.stride_g + (i - m * L.g128));
  }
  __syncthreads();

  // 3. Row group by row group.
  gemv_rows<LANES, CMAX, HINT, PREFETCH, M>(p, L, smem, cur, f);
}

// ------------------------------------------------- the producer inside the GEMV (M = 1)
//
// A fused launch runs the activation producer (kernels/pq2/hadamard.py) in every CTA, so a
// linear is one launch: before the grid-dependency wait each warp asks L2 for its first row
// group's codes and scales (prefetch: no registers held), then the CTA builds the int8
// activation in shared memory from x, and the GEMV runs as above. Thread t of the CTA holds
// the 32 values of unit t (values 32t .. 32t + 31: the CTA has at least K / 32 threads), so a
// warp holds 1024 consecutive values and the block Hadamard (at most 1024) runs in registers
// and lane shuffles, each 128-group's int8 quantization over four lanes.

constexpr int kFusedThreads = 1024;

__device__ __forceinline__ void prefetch_l2(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(ptr));
}

// Asks L2 for every 128-byte line of the codes and scales of row group `rg` (rows
// rg * 32 / LANES ...): the loads of its first pass then find them there.
template <int LANES>
__device__ __forceinline__ void prefetch_row_group(const Pq2LinearParams& p, int rg, int lane,
                                                   int g64) {
  constexpr int kRows = 32 / LANES;
  const int row0 = rg * kRows;
  if (row0 >= p.n) return;
  const int rows = min(kRows, p.n - row0);
  const int bytes = g64 * 16;
  const int lines = bytes / 128 + 2;  // a row's codes, wherever its 16-byte start lies
  for (int t = lane; t < rows * lines; t += 32) {
    const int r = t / lines, l = t - r * lines;
    const char* row = reinterpret_cast<const char*>(p.codes + (row0 + r) * p.stride_c);
    const char* line = reinterpret_cast<const char*>(
        (reinterpret_cast<uintptr_t>(row) & ~static_cast<uintptr_t>(127)) + 128 * l);
    if (line < row + bytes) prefetch_l2(line);
  }
  if (lane < rows) {  // the row's fp16 scales: g64 / 2 of them, at most two lines
    const char* srow = reinterpret_cast<const char*>(p.scales + (row0 + lane) * p.stride_s);
    prefetch_l2(srow);
    prefetch_l2(srow + g64 - 1);
  }
}

// Builds the int8 activation of x in shared memory (L: the GEMV's layout; red: 32 floats):
// every thread of the CTA takes part (producer_device.cuh); CTA 0 writes the residual sum.
__device__ __forceinline__ void produce_activation(const Pq2LinearParams& p,
                                                   const Pq2PrologueParams& q,
                                                   const GemvSmem& L, char* smem, float* red) {
  ProducedUnit pu;
  if (!produce_unit(p.k, q, blockIdx.x == 0, red, pu)) return;
  const int u = threadIdx.x;
  const int sum = pu.sum + __shfl_xor_sync(kFull, pu.sum, 1);  // the 64-chunk: with the neighbour
  if (pu.mine) {
    const int g = u >> 1, j0 = 2 * (u & 1);
    int4* xs = reinterpret_cast<int4*>(smem + L.x);
    xs[j0 * L.g64 + g] = make_int4(pu.words[0], pu.words[1], pu.words[2], pu.words[3]);
    xs[(j0 + 1) * L.g64 + g] = make_int4(pu.words[4], pu.words[5], pu.words[6], pu.words[7]);
    if ((u & 1) == 0) reinterpret_cast<int*>(smem + L.xsum)[g] = sum;
    if ((u & 3) == 0) reinterpret_cast<float*>(smem + L.sx)[u >> 2] = pu.amax / 127.f;
  }
}

template <int LANES, int CMAX, int HINT, bool PREFETCH>
__global__ void __launch_bounds__(kFusedThreads, 1)
    pq2_gemv_fused_kernel(const __grid_constant__ Pq2LinearParams p,
                          const __grid_constant__ Pq2PrologueParams q) {
  extern __shared__ __align__(16) char smem[];
  if (p.pdl) pdl_launch_dependents();
  constexpr int kRowsPerWarp = 32 / LANES;
  const GemvSmem L(p.k, 1);
  const int lane = threadIdx.x & 31, hl = lane % LANES, sub = lane / LANES;
  const int groups = (p.n + kRowsPerWarp - 1) / kRowsPerWarp;
  const Cursor cur{static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x >> 5) +
                       static_cast<int>(threadIdx.x >> 5),
                   0};
  // 1. The first row group's weights on their way to L2: independent of the previous kernel.
  if (cur.rg < groups) prefetch_row_group<LANES>(p, cur.rg, lane, L.g64);
  if (p.pdl) pdl_wait();  // x (and the residual, the gate) are complete past here
  // 2. The activation, made by this CTA.
  produce_activation(p, q, L, smem, reinterpret_cast<float*>(smem + L.bytes));
  __syncthreads();
  // 3. Row group by row group.
  Frag<CMAX> f;
  if (cur.rg < groups) load_frag<LANES, CMAX, HINT>(f, p, cur, hl, sub, L.g64);
  gemv_rows<LANES, CMAX, HINT, PREFETCH, 1>(p, L, smem, cur, f);
}

using FusedKernelFn = void (*)(Pq2LinearParams, Pq2PrologueParams);

// The fused kernel of a layout pq2_gemv_default_config chooses at M = 1.
FusedKernelFn fused_kernel_for(const GemvConfig& cfg) {
#define PQ2_GEMV_FUSED(L, C, H, P) \
  if (cfg.lanes == L && cfg.cmax == C && cfg.hint == H && cfg.prefetch == P) \
    return &pq2_gemv_fused_kernel<L, C, H, P>;
  PQ2_GEMV_FUSED(8, 5, 1, false)
  PQ2_GEMV_FUSED(16, 5, 1, false)
  PQ2_GEMV_FUSED(16, 3, 1, true)
  PQ2_GEMV_FUSED(16, 6, 1, false)
#undef PQ2_GEMV_FUSED
  return nullptr;
}

using KernelFn = void (*)(Pq2LinearParams);

// A kernel for M = 1..MAXM activation rows of one layout.
template <int L, int C, int H, bool P, int MAXM = kPq2GemvMaxM>
KernelFn kernel_for_m(int m) {
  if (m == 1) return &pq2_gemv_int8_kernel<L, C, H, P, 1>;
#ifdef PQ2_GEMV_ALL_CONFIGS
  constexpr bool kRows = H == 1;  // the sweep times cache hints at M = 1 only
#else
  constexpr bool kRows = true;
#endif
  if constexpr (kRows) {
    if (m == 2) return &pq2_gemv_int8_kernel<L, C, H, P, 2>;
    if constexpr (MAXM >= 3) {
      if (m == 3) return &pq2_gemv_int8_kernel<L, C, H, P, 3>;
    }
    if constexpr (MAXM >= 4) {
      if (m == 4) return &pq2_gemv_int8_kernel<L, C, H, P, 4>;
    }
  }
  return nullptr;
}

// The compiled configurations (lanes, chunks a lane holds, cache hint, prefetch). The
// library keeps the layouts pq2_gemv_default_config chooses; PQ2_GEMV_ALL_CONFIGS (the
// kernel sweep, benchmarks/kernels/pq2_gemv_sweep.cu) compiles a wider set.
#define PQ2_GEMV_CONFIG(L, C, H, P, ...) \
  if (cfg.lanes == L && cfg.cmax == C && cfg.hint == H && cfg.prefetch == P) \
    return kernel_for_m<L, C, H, P, ##__VA_ARGS__>(m);

KernelFn kernel_for(const GemvConfig& cfg, int m) {
#ifdef PQ2_GEMV_ALL_CONFIGS
#define PQ2_GEMV_HINTS(L, C)                                                  \
  PQ2_GEMV_CONFIG(L, C, 0, false) PQ2_GEMV_CONFIG(L, C, 1, false)             \
  PQ2_GEMV_CONFIG(L, C, 2, false) PQ2_GEMV_CONFIG(L, C, 0, true)              \
  PQ2_GEMV_CONFIG(L, C, 1, true) PQ2_GEMV_CONFIG(L, C, 2, true)
  PQ2_GEMV_HINTS(8, 5) PQ2_GEMV_HINTS(8, 10)
  PQ2_GEMV_HINTS(16, 3) PQ2_GEMV_HINTS(16, 5) PQ2_GEMV_HINTS(16, 6) PQ2_GEMV_HINTS(16, 9)
  PQ2_GEMV_HINTS(32, 3) PQ2_GEMV_HINTS(32, 5) PQ2_GEMV_HINTS(32, 9)
#undef PQ2_GEMV_HINTS
#else
  PQ2_GEMV_CONFIG(8, 5, 1, false)
  PQ2_GEMV_CONFIG(16, 5, 1, false)
  PQ2_GEMV_CONFIG(16, 3, 1, true, 2)  // M <= 2: at M = 3 it spills on sm_80
  PQ2_GEMV_CONFIG(16, 6, 1, false)
#endif
  return nullptr;
}
#undef PQ2_GEMV_CONFIG

}  // namespace

// Timed on the H200 (benchmarks/results/pq2_gemv_sweep_h200.md): rows of up to 5120 weights
// in two passes of 8 lanes x 5 chunks (four rows a warp; 4-warp CTAs, at most 8 a
// multiprocessor, at M = 1; 8-warp CTAs above), 16 lanes and 8 warps below 4096 rows; up to
// 6144 weights 16 lanes x 3 chunks with prefetch (M <= 2); longer rows (and M > 2) 16 lanes x
// 6 chunks.
GemvConfig pq2_gemv_default_config(int n, int k, int m) {
  const int g64 = k / 64;
  GemvConfig cfg;
  cfg.hint = 1;
  cfg.warps = 8;
  if (g64 <= 80 && n >= 4096) {
    cfg.lanes = 8, cfg.cmax = 5, cfg.prefetch = false;
    if (m == 1) cfg.warps = 4, cfg.ctas_per_sm = 8;
  } else if (g64 <= 80) {
    cfg.lanes = 16, cfg.cmax = 5, cfg.prefetch = false, cfg.ctas_per_sm = 4;
  } else if (g64 <= 96 && m <= 2) {
    cfg.lanes = 16, cfg.cmax = 3, cfg.prefetch = true, cfg.ctas_per_sm = 8;
    if (m == 1) cfg.warps = 4;
  } else {
    cfg.lanes = 16, cfg.cmax = 6, cfg.prefetch = false, cfg.ctas_per_sm = 0;
  }
  return cfg;
}

cudaError_t pq2_gemv_int8_launch_config(const Pq2LinearParams& p, const GemvConfig& cfg,
                                        int sm_count, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  if (p.m < 1 || p.m > kPq2GemvMaxM || p.k % 64 != 0 || p.split != 1) {
    return cudaErrorInvalidValue;
  }
  // 16-byte loads of code chunks and activation pieces
  if (reinterpret_cast<uintptr_t>(p.codes) % 16 || (p.stride_c * 4) % 16 ||
      reinterpret_cast<uintptr_t>(p.xq) % 16 || (p.m > 1 && p.stride_x % 16)) {
    return cudaErrorMisalignedAddress;
  }
  const KernelFn fn = kernel_for(cfg, p.m);
  if (fn == nullptr || cfg.warps < 1 || cfg.warps * 32 > kThreads) return cudaErrorInvalidValue;
  const GemvSmem layout(p.k, p.m);
  if (layout.bytes > 48 * 1024) {
    if (layout.bytes > max_dynamic_smem_per_block()) return cudaErrorInvalidValue;
    const cudaError_t err =
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, layout.bytes);
    if (err != cudaSuccess) return err;
  }
  const int64_t groups = (p.n + 32 / cfg.lanes - 1) / (32 / cfg.lanes);
  int64_t grid = (groups + cfg.warps - 1) / cfg.warps;
  if (cfg.ctas_per_sm > 0 && grid > static_cast<int64_t>(sm_count) * cfg.ctas_per_sm) {
    grid = static_cast<int64_t>(sm_count) * cfg.ctas_per_sm;
  }
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(grid), 1, 1);
  lc.blockDim = dim3(32 * cfg.warps, 1, 1);
  lc.dynamicSmemBytes = layout.bytes;
  lc.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(lc, attr, p.pdl);
  return cudaLaunchKernelEx(&lc, fn, p);
}

cudaError_t pq2_gemv_int8_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream) {
  return pq2_gemv_int8_launch_config(p, pq2_gemv_default_config(p.n, p.k, p.m), sm_count,
                                     stream);
}

// One CTA per multiprocessor at most (the producer runs once per CTA), with enough warps for
// a unit of 32 values per thread and, where the rows allow, every row group in one pass of the
// grid; the GEMV layout is the one the plain launch takes at M = 1.
cudaError_t pq2_gemv_fused_launch(const Pq2LinearParams& p, const Pq2PrologueParams& q,
                                  int sm_count, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  if (p.m != 1 || p.k % 128 != 0 || p.k > kPq2GemvFusedMaxK || p.split != 1 ||
      q.log_b < 0 || q.log_b > 10 || (q.log_b > 0 && q.signs == nullptr) ||
      (q.rms_group != 0 && (q.rms_group < 32 || q.rms_group > 1024 || p.k % q.rms_group))) {
    return cudaErrorInvalidValue;
  }
  if (reinterpret_cast<uintptr_t>(p.codes) % 16 || (p.stride_c * 4) % 16 ||
      reinterpret_cast<uintptr_t>(q.signs) % 16) {
    return cudaErrorMisalignedAddress;
  }
  const GemvConfig cfg = pq2_gemv_default_config(p.n, p.k, 1);
  const FusedKernelFn fn = fused_kernel_for(cfg);
  if (fn == nullptr || sm_count < 1) return cudaErrorInvalidValue;
  const int64_t groups = (p.n + 32 / cfg.lanes - 1) / (32 / cfg.lanes);
  int64_t warps = (groups + sm_count - 1) / sm_count;
  warps = std::max<int64_t>(warps, (p.k + 1023) / 1024);
  warps = std::min<int64_t>(warps, kFusedThreads / 32);
  const int64_t grid = std::min<int64_t>((groups + warps - 1) / warps, sm_count);
  const int bytes = GemvSmem(p.k, 1).bytes + 32 * 4;
  if (bytes > 48 * 1024) {
    if (bytes > max_dynamic_smem_per_block()) return cudaErrorInvalidValue;
    const cudaError_t err =
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return err;
  }
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(grid), 1, 1);
  lc.blockDim = dim3(static_cast<unsigned>(32 * warps), 1, 1);
  lc.dynamicSmemBytes = bytes;
  lc.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(lc, attr, p.pdl);
  return cudaLaunchKernelEx(&lc, fn, p, q);
}

}  // namespace vllm_prism
