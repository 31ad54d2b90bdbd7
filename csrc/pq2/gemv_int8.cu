// PQ2 GEMV for M = 1 (see gemv_int8.cuh). Torch-free; the torch op is in gemv_int8_op.cu.
//
// Layout of the work: a CTA owns R consecutive weight rows (R = 1..32, chosen on the host so
// that a few CTAs fit on each multiprocessor) and requests every byte of them at its start:
// the codes and fp16 scales of all R rows go to shared memory through cp.async, one commit
// group per round of rows (a round is one row per warp). Nothing of the weights waits for
// the computation, so a multiprocessor holds its whole share of a mid-size matrix in flight
// (the register-ring design before this one kept four rows a warp in flight and was bound by
// memory latency at 15-17 % occupancy: benchmarks/results/pq2_linear_h200_notes.md). The
// activation (int8, K bytes) is staged in shared memory after the grid-dependency wait,
// stored piece-major ([4][K/64] of 16 bytes) so that lane l reads group l without bank
// conflicts, with the int32 sum of each 64-group. Per round, each warp reduces one row: lane l
// takes the 64-weight groups l, l + 32, ...; per group the integer dot minus the activation's
// own sum is exact, then scaled by the weight's and the activation's 128-group scales in fp32.
#include "gemv_int8.cuh"

#include "pq2_device.cuh"

namespace vllm_prism {
namespace {

constexpr int kMaxWarps = 8;
constexpr int kMaxRows = 32;
constexpr uint32_t kMask = 0x03030303u;
// Shared memory a CTA may ask for: four CTAs a multiprocessor where the rows allow it.
constexpr int kSmemTarget = 56 * 1024;
constexpr int kSmemMax = 200 * 1024;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One code group (16 codes x 4 words) against its 64 activation bytes.
__device__ __forceinline__ int dot64(const uint4& w, const int4 (&x)[4]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  int acc = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t c = words[i];
    acc = __dp4a(static_cast<int>(c & kMask), x[i].x, acc);
    acc = __dp4a(static_cast<int>((c >> 2) & kMask), x[i].y, acc);
    acc = __dp4a(static_cast<int>((c >> 4) & kMask), x[i].z, acc);
    acc = __dp4a(static_cast<int>((c >> 6) & kMask), x[i].w, acc);
  }
  return acc;
}

// Where each part lives in a CTA's dynamic shared memory (byte offsets, 16-byte aligned).
struct GemvSmem {
  int g64, g128;        // 64- and 128-groups of a row
  int row_bytes;        // codes of one row: K / 4
  int scale_words;      // 4-byte words of one row's scales: ceil(K / 256)
  int x, xsum, sx, codes, scales, bytes;

  __host__ __device__ GemvSmem(int k, int rows) {
    g64 = k / 64;
    g128 = (k + 127) / 128;
    row_bytes = k / 4;
    scale_words = (g128 + 1) / 2;
    x = 0;                                        // int4 [4][g64]
    xsum = x + k;                                 // int32 [g64]
    sx = xsum + align16(4 * g64);                 // fp32 [g128]
    codes = sx + align16(4 * g128);               // [rows][row_bytes]
    scales = codes + rows * row_bytes;            // [rows][scale_words] uint32
    bytes = scales + align16(4 * rows * scale_words);
  }
};

__global__ void __launch_bounds__(kMaxWarps * 32)
    pq2_gemv_int8_kernel(const __grid_constant__ Pq2LinearParams p, int rows) {
  extern __shared__ __align__(16) char smem[];
  if (p.pdl) pdl_launch_dependents();
  const GemvSmem L(p.k, rows);
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int warps = nthreads >> 5, warp = tid >> 5, lane = tid & 31;
  const int rounds = rows / warps;
  const int row0 = blockIdx.x * rows;
  const int pieces = L.row_bytes / 16;  // 16-byte code pieces of a row

  // 1. Every weight byte of the CTA's rows, one commit group per round (rows past N read
  //    row N - 1; their results are not stored). Independent of the previous kernel, so
  //    issued before the grid-dependency wait.
  for (int rd = 0; rd < rounds; ++rd) {
    const int per_round = warps * pieces;
    for (int i = tid; i < per_round; i += nthreads) {
      const int r = rd * warps + i / pieces, j = i % pieces;
      const int row = min(row0 + r, p.n - 1);
      cp_async16(smem + L.codes + r * L.row_bytes + 16 * j,
                 reinterpret_cast<const char*>(p.codes + row * p.stride_c) + 16 * j);
    }
    for (int i = tid; i < warps * L.scale_words; i += nthreads) {
      const int r = rd * warps + i / L.scale_words, j = i % L.scale_words;
      const int row = min(row0 + r, p.n - 1);
      cp_async4(smem + L.scales + 4 * (r * L.scale_words + j),
                p.scales + row * p.stride_s + 2 * j);
    }
    cp_async_commit();
  }
  if (p.pdl) pdl_wait();  // the activation is complete past here

  // 2. The activation, piece-major, and its scales.
  int4* xs = reinterpret_cast<int4*>(smem + L.x);
  const int4* xg = reinterpret_cast<const int4*>(p.xq);
  for (int q = tid; q < L.g64 * 4; q += nthreads) xs[(q & 3) * L.g64 + (q >> 2)] = __ldg(xg + q);
  float* sxs = reinterpret_cast<float*>(smem + L.sx);
  for (int g = tid; g < L.g128; g += nthreads) sxs[g] = __ldg(p.sx + g);
  __syncthreads();
  int* xsum = reinterpret_cast<int*>(smem + L.xsum);
  for (int g = tid; g < L.g64; g += nthreads) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int4 v = xs[i * L.g64 + g];
      s = __dp4a(0x01010101, v.x, s);
      s = __dp4a(0x01010101, v.y, s);
      s = __dp4a(0x01010101, v.z, s);
      s = __dp4a(0x01010101, v.w, s);
    }
    xsum[g] = s;
  }

  // 3. Round by round, as its group lands: one row per warp.
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(smem + L.scales);
  for (int rd = 0; rd < rounds; ++rd) {
    cp_async_wait_at_most(rounds - 1 - rd);
    __syncthreads();  // every thread's part of this round (and, the first time, xsum)
    const int r = rd * warps + warp;
    const char* codes = smem + L.codes + r * L.row_bytes;
    const uint16_t* d_row = scales + 2 * r * L.scale_words;
    float acc = 0.f;
    for (int g = lane; g < L.g64; g += 32) {
      const uint4 w = *reinterpret_cast<const uint4*>(codes + 16 * g);
      int4 x[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = xs[i * L.g64 + g];
      const int dot = dot64(w, x) - xsum[g];
      const float d = __half2float(__ushort_as_half(d_row[g >> 1]));
      acc += exact_float(dot) * (d * sxs[g >> 1]);
    }
    acc = warp_sum(acc);
    const int row = row0 + r;
    if (lane == 0 && row < p.n) {
      const float b = p.bias ? load_as_float(p.bias, row, p.bias_dtype) : 0.f;
      store_out(p, row, acc + b);
    }
  }
}

// Rows a CTA owns: as many as fit the shared-memory target (up to 32), fewer where the grid
// would leave multiprocessors idle, fewer still where a block may not have that much shared
// memory (`smem_max`), a power of two.
int rows_per_cta(int n, int k, int sm_count, int smem_max) {
  int rows = kMaxRows;
  while (rows > 8 && GemvSmem(k, rows).bytes > kSmemTarget) rows >>= 1;
  while (rows > 8 && (n + rows - 1) / rows < sm_count) rows >>= 1;
  while (rows > 1 && GemvSmem(k, rows).bytes > smem_max) rows >>= 1;
  return rows;
}

}  // namespace

cudaError_t pq2_gemv_int8_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  if (p.m != 1 || p.k % 64 != 0 || p.split != 1) return cudaErrorInvalidValue;
  // 16-byte cp.async of code rows and activation pieces, 4-byte ones of scale pairs
  if (reinterpret_cast<uintptr_t>(p.codes) % 16 || (p.stride_c * 4) % 16 ||
      reinterpret_cast<uintptr_t>(p.xq) % 16 || reinterpret_cast<uintptr_t>(p.scales) % 4 ||
      p.stride_s % 2) {
    return cudaErrorMisalignedAddress;
  }
  const int smem_max = min(kSmemMax, max_dynamic_smem_per_block());
  const int rows = rows_per_cta(p.n, p.k, sm_count, smem_max);
  const GemvSmem layout(p.k, rows);
  if (layout.bytes > smem_max) return cudaErrorInvalidValue;  // K too long for one row
  cudaError_t err = cudaFuncSetAttribute(pq2_gemv_int8_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         layout.bytes);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.n + rows - 1) / rows, 1, 1);
  cfg.blockDim = dim3(32 * (rows < kMaxWarps ? rows : kMaxWarps), 1, 1);
  cfg.dynamicSmemBytes = layout.bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(cfg, attr, p.pdl);
  return cudaLaunchKernelEx(&cfg, pq2_gemv_int8_kernel, p, rows);
}

}  // namespace vllm_prism
