// A fused PQ2 prefill GEMM on Hopper's warpgroup MMA, outside torch: the first step towards
// the prefill target (>= 1.0x bf16 F.linear at M >= 512, ../shared/perf/targets.md) that the
// dequantize-then-cuBLAS path (gemm_dq, 0.67-0.93x) and cuBLAS's FP8 block scaling (gemm_fp8,
// 0.54-1.22x) miss. Built and run by `bash scripts/gpu-session.sh wgmma-sweep [SHAPES [MS]]`
// (nvcc -arch=sm_90a; with -DPQ2_WITH_CUBLAS -lcublas, cuBLAS's bf16 GEMM of the same shape
// is timed in the same run as the baseline).
//
// y[m, n] = sum_g d[n, g] * sx[m, g] * (sum_{k in g} c[n, k] * xq[m, k] - qsum[m, g]), the
// formula of csrc/pq2/pq2_params.cuh (codes c in 0..2 as unsigned weights plus one).
//
// A CTA computes 128 weight rows x 128 tokens with two warpgroups (64 rows each):
// * Each 128-group of K is one pipeline stage, copied by every thread with cp.async: the
//   tokens' 128 int8 activations in wgmma's K-major no-swizzle layout (8 x 16-byte core
//   matrices: LBO 128 B along K, SBO 1024 B along the tokens), the rows' 32 bytes of codes,
//   the tokens' scales and sums.
// * The weights are wgmma's A operand from registers: a lane's fragment of rows g and g + 8,
//   k 4t.. and 16 + 4t.. of a 32-wide step, is (word >> 2t) & 0x03030303 of the rows' code
//   words (prepared layout: element 16w + 4q + b at bits 8b + 2q of word w), two
//   instructions a register; the activations are B from shared memory.
// * Four wgmma.m64n128k32.s32.s8.s8 per group into int32 sums, then the group's scales into
//   fp32 accumulators (pq2_device.cuh's exact_float, the token's group sum folded into its
//   integer add: |sum| < 2^22).
// * Two variants, both timed: each group issued, waited for and promoted in turn (183
//   registers), and `_overlap`, where group g's MMAs run while the lane promotes group g - 1
//   from a second set of sums (240 registers; loads two stages ahead instead of three).
// The host reference checks sampled rows of every token against the formula in doubles.

#include <cuda_bf16.h>
#ifdef PQ2_WITH_CUBLAS
#include <cublas_v2.h>
#endif

#include "pq2/pq2_device.cuh"
#include "pq2_sweep_common.cuh"

using namespace pq2_sweep;

namespace {

constexpr int kRows = 128;      // weight rows a CTA (two warpgroups of 64)
constexpr int kTok = 128;       // tokens a CTA (wgmma N)
constexpr int kStages = 4;      // 128-groups in flight
constexpr int kThreads = 256;
constexpr int kBBytes = kTok * 128;          // activations of a group: 16 KiB
constexpr int kABytes = kRows * 32;          // codes of a group: 4 KiB
constexpr int kSBytes = kTok * 4 * 2;        // sx and qsum of a group: 1 KiB
constexpr int kStageBytes = kBBytes + kABytes + kSBytes;
constexpr int kSmem = kStages * kStageBytes;

using vllm_prism::cp_async_commit;
using vllm_prism::cp_async_wait;
using vllm_prism::smem_addr;

// 16 / 4 bytes global -> shared, zero-filled where `valid` is false (pq2_device.cuh's copies
// have no zero fill).
__device__ __forceinline__ void cp16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(valid ? 4 : 0));
}

// K-major, no swizzle: start address, LBO (next core matrix along K), SBO (next 8 tokens).
__device__ __forceinline__ uint64_t b_desc(const void* p) {
  const uint64_t addr = smem_addr(p);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(128 >> 4) << 16) | (uint64_t(1024 >> 4) << 32);
}

#define PQ2_R8(i) "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), \
                  "+r"(d[i + 4]), "+r"(d[i + 5]), "+r"(d[i + 6]), "+r"(d[i + 7])

// d (64 x 128 int32 of the warpgroup, 64 a thread) (+)= A (64 x 32, registers) x B (32 x 128).
__device__ __forceinline__ void wgmma_s8(int32_t (&d)[64], const uint32_t (&a)[4], uint64_t desc,
                                         int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %69, p;\n}\n"
      : PQ2_R8(0), PQ2_R8(8), PQ2_R8(16), PQ2_R8(24), PQ2_R8(32), PQ2_R8(40), PQ2_R8(48),
        PQ2_R8(56)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc));
}
#undef PQ2_R8

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::); }
// The asynchronous MMA reads its A registers and writes its accumulators after the issuing asm
// statement returns: an empty asm that "writes" a register orders it after the wait (no read
// of the sums moves above it, no other value takes an operand's register before it).
__device__ __forceinline__ void fence_reg(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(int32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::);
}
__device__ __forceinline__ void wgmma_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

struct Args {
  const int32_t* codes;    // [N, K/16]
  const uint16_t* scales;  // fp16 [N, gpad]
  const int8_t* xq;        // [M, K]
  const float* sx;         // [M, g128]
  const int32_t* qsum;     // [M, g128]
  __nv_bfloat16* out;      // [M, N]
  int m, n, k, g128, gpad;
};

// Stage `g` of the CTA's tile (rows r0.., tokens t0..) into buffer `buf`.
__device__ __forceinline__ void load_stage(const Args& p, char* buf, int g, int r0, int t0) {
  const int tid = threadIdx.x;
  char* sb = buf;
  char* sa = buf + kBBytes;
  char* ss = buf + kBBytes + kABytes;
  // activations: 128 tokens x 8 chunks of 16 bytes, 4 a thread
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = tid + i * kThreads;  // 0..1023
    const int tok = c >> 3, j = c & 7;
    const bool ok = t0 + tok < p.m;
    const int8_t* src = p.xq + int64_t(ok ? t0 + tok : 0) * p.k + g * 128 + j * 16;
    cp16(sb + (tok >> 3) * 1024 + j * 128 + (tok & 7) * 16, src, ok);
  }
  // codes: 128 rows x 2 chunks of 16 bytes, 1 a thread
  {
    const int row = tid >> 1, j = tid & 1;
    const bool ok = r0 + row < p.n;
    const int32_t* src = p.codes + int64_t(ok ? r0 + row : 0) * (p.k / 16) + g * 8 + j * 4;
    cp16(sa + row * 32 + j * 16, src, ok);
  }
  // token scales and sums: 128 of each, one 4-byte copy a thread
  {
    const int tok = tid & 127;
    const bool ok = t0 + tok < p.m;
    const int64_t off = int64_t(ok ? t0 + tok : 0) * p.g128 + g;
    if (tid < 128) cp4(ss + tok * 4, p.sx + off, ok);
    else cp4(ss + 512 + tok * 4, p.qsum + off, ok);
  }
}

// The CTA's rows and lane roles.
struct Lane {
  int r0, t0, row_a, tq;  // row_a: this lane's first row in the tile (the other is row_a + 8)
  bool row0_ok, row1_ok;
  const uint16_t* srow0;
  const uint16_t* srow1;
};

// Group g's MMAs into `d` (asynchronous: `a` and `d` stay untouched until the wait).
__device__ __forceinline__ void issue_group(const char* buf, const Lane& l, uint32_t (&a)[4][4],
                                            int32_t (&d)[64]) {
  const uint4* codes = reinterpret_cast<const uint4*>(buf + kBBytes);
  const uint4 w0a = codes[l.row_a * 2], w0b = codes[l.row_a * 2 + 1];
  const uint4 w1a = codes[(l.row_a + 8) * 2], w1b = codes[(l.row_a + 8) * 2 + 1];
  const uint32_t r0w[8] = {w0a.x, w0a.y, w0a.z, w0a.w, w0b.x, w0b.y, w0b.z, w0b.w};
  const uint32_t r1w[8] = {w1a.x, w1a.y, w1a.z, w1a.w, w1b.x, w1b.y, w1b.z, w1b.w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    a[c][0] = (r0w[2 * c] >> (2 * l.tq)) & 0x03030303u;
    a[c][1] = (r1w[2 * c] >> (2 * l.tq)) & 0x03030303u;
    a[c][2] = (r0w[2 * c + 1] >> (2 * l.tq)) & 0x03030303u;
    a[c][3] = (r1w[2 * c + 1] >> (2 * l.tq)) & 0x03030303u;
  }
  const uint64_t desc = b_desc(buf);
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_reg(d[i]);
  wgmma_fence();
#pragma unroll
  for (int c = 0; c < 4; ++c) wgmma_s8(d, a[c], desc + uint64_t((c * 256) >> 4), c > 0);
  wgmma_commit();
}

// Wait for the MMAs in flight; then `d` holds their sums and `a` may be reused.
__device__ __forceinline__ void wait_group(uint32_t (&a)[4][4], int32_t (&d)[64]) {
  wgmma_wait0();
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_reg(d[i]);
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i) fence_reg(a[c][i]);
}

// Group g's int32 sums `d` (stage buffer `buf`) into the fp32 accumulators.
__device__ __forceinline__ void promote(const char* buf, const Lane& l, int g,
                                        const int32_t (&d)[64], float (&acc)[64]) {
  const float d0 = l.row0_ok ? __half2float(__ushort_as_half(l.srow0[g])) : 0.f;
  const float d1 = l.row1_ok ? __half2float(__ushort_as_half(l.srow1[g])) : 0.f;
  const float* sx = reinterpret_cast<const float*>(buf + kBBytes + kABytes);
  const int32_t* qs = reinterpret_cast<const int32_t*>(buf + kBBytes + kABytes + 512);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * l.tq;
    const float2 s = *reinterpret_cast<const float2*>(sx + col);
    const int2 q = *reinterpret_cast<const int2*>(qs + col);
    const int32_t m0 = 0x4B400000 - q.x, m1 = 0x4B400000 - q.y;
    acc[4 * j + 0] += d0 * s.x * (__int_as_float(d[4 * j + 0] + m0) - 12582912.0f);
    acc[4 * j + 1] += d0 * s.y * (__int_as_float(d[4 * j + 1] + m1) - 12582912.0f);
    acc[4 * j + 2] += d1 * s.x * (__int_as_float(d[4 * j + 2] + m0) - 12582912.0f);
    acc[4 * j + 3] += d1 * s.y * (__int_as_float(d[4 * j + 3] + m1) - 12582912.0f);
  }
}

// kOverlap: group g's MMAs run while the lane promotes group g - 1's sums (two int32 sum sets;
// the next load goes two stages ahead, so stage g - 1 is still there). Otherwise each group
// is issued, waited for and promoted in turn.
template <bool kOverlap>
__device__ __forceinline__ void group_step(const Args& p, char* smem, const Lane& l, int g,
                                           int32_t (&dc)[64], int32_t (&dp)[64],
                                           float (&acc)[64]) {
  constexpr int kDist = kOverlap ? kStages - 2 : kStages - 1;
  cp_async_wait<kDist - 1>();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  if (g + kDist < p.g128)
    load_stage(p, smem + ((g + kDist) % kStages) * kStageBytes, g + kDist, l.r0, l.t0);
  cp_async_commit();
  const char* buf = smem + (g % kStages) * kStageBytes;
  uint32_t a[4][4];
  issue_group(buf, l, a, dc);
  if (kOverlap) {
    if (g > 0) promote(smem + ((g - 1) % kStages) * kStageBytes, l, g - 1, dp, acc);
    wait_group(a, dc);
  } else {
    wait_group(a, dc);
    promote(buf, l, g, dc, acc);
  }
}

template <bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1) pq2_wgmma_kernel(const Args p) {
  extern __shared__ __align__(1024) char smem[];
  constexpr int kDist = kOverlap ? kStages - 2 : kStages - 1;
  Lane l;
  l.r0 = blockIdx.x * kRows;
  l.t0 = blockIdx.y * kTok;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  l.tq = lane & 3;
  l.row_a = wg * 64 + warp * 16 + (lane >> 2);
  l.row0_ok = l.r0 + l.row_a < p.n;
  l.row1_ok = l.r0 + l.row_a + 8 < p.n;
  l.srow0 = p.scales + int64_t(l.row0_ok ? l.r0 + l.row_a : 0) * p.gpad;
  l.srow1 = p.scales + int64_t(l.row1_ok ? l.r0 + l.row_a + 8 : 0) * p.gpad;
  const int G = p.g128;

  for (int s = 0; s < kDist; ++s) {
    if (s < G) load_stage(p, smem + s * kStageBytes, s, l.r0, l.t0);
    cp_async_commit();
  }
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  int32_t d0[64], d1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d0[i] = d1[i] = 0;
  for (int g = 0; g < G; g += 2) {
    if (kOverlap) {
      group_step<true>(p, smem, l, g, d0, d1, acc);
      if (g + 1 < G) group_step<true>(p, smem, l, g + 1, d1, d0, acc);
    } else {
      group_step<false>(p, smem, l, g, d0, d0, acc);
      if (g + 1 < G) group_step<false>(p, smem, l, g + 1, d0, d0, acc);
    }
  }
  if (kOverlap) {  // the last group's sums (its stage was not overwritten)
    const char* last = smem + ((G - 1) % kStages) * kStageBytes;
    if ((G - 1) & 1) promote(last, l, G - 1, d1, acc);
    else promote(last, l, G - 1, d0, acc);
  }
  cp_async_wait<0>();
  // D layout: element 4j + 2h + e is row (row_a + 8h), token 8j + 2tq + e
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int tok = l.t0 + 8 * j + 2 * l.tq + e;
      if (tok >= p.m) continue;
      if (l.row0_ok)
        p.out[int64_t(tok) * p.n + l.r0 + l.row_a] = __float2bfloat16_rn(acc[4 * j + e]);
      if (l.row1_ok)
        p.out[int64_t(tok) * p.n + l.r0 + l.row_a + 8] = __float2bfloat16_rn(acc[4 * j + 2 + e]);
    }
}

cudaError_t launch(const Args& p, bool overlap, cudaStream_t s) {
  dim3 grid((p.n + kRows - 1) / kRows, (p.m + kTok - 1) / kTok);
  if (overlap) pq2_wgmma_kernel<true><<<grid, kThreads, kSmem, s>>>(p);
  else pq2_wgmma_kernel<false><<<grid, kThreads, kSmem, s>>>(p);
  return cudaGetLastError();
}

__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16((int(mix(i, seed) % 2001) - 1000) * 1e-3f);
}

}  // namespace

int main(int argc, char** argv) {
  const auto shapes = parse_shapes(argc > 1 ? argv[1]
                                            : "12288x5120,34816x5120,5120x6144,5120x17408");
  const auto ms = parse_ints(argc > 2 ? argv[2] : "512,2048,4096");
  SweepDevice dev;
  CHECK(cudaFuncSetAttribute(pq2_wgmma_kernel<false>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CHECK(cudaFuncSetAttribute(pq2_wgmma_kernel<true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
#ifdef PQ2_WITH_CUBLAS
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(blas, dev.s);
#endif
  const int mmax = *std::max_element(ms.begin(), ms.end());
  for (const Shape& sh : shapes) {
    WeightSlabs w(sh.n, sh.k, dev.sms, dev.s);
    DeviceActivation x(mmax, sh.k, w.g128);
    __nv_bfloat16 *out, *wb, *xb, *yb;
    CHECK(cudaMalloc(&out, int64_t(mmax) * sh.n * 2));
    CHECK(cudaMalloc(&wb, int64_t(sh.n) * sh.k * 2));
    CHECK(cudaMalloc(&xb, int64_t(mmax) * sh.k * 2));
    CHECK(cudaMalloc(&yb, int64_t(mmax) * sh.n * 2));
    fill_bf16<<<4 * dev.sms, 256, 0, dev.s>>>(wb, int64_t(sh.n) * sh.k, 3);
    fill_bf16<<<4 * dev.sms, 256, 0, dev.s>>>(xb, int64_t(mmax) * sh.k, 5);
    // rows to check: the first, the last and a spread between
    std::vector<int> rows;
    for (int i = 0; i < 24; ++i) rows.push_back(int(int64_t(i) * (sh.n - 1) / 23));
    double ref_max = 0;
    const auto ref = host_reference(w, x.hx, x.hsx, mmax, rows, ref_max);
    for (int m : ms) {
      double bf16_us = 0;
#ifdef PQ2_WITH_CUBLAS
      const float one = 1.f, zero = 0.f;
      bf16_us = time_graph(8, [&](int) {
        const cublasStatus_t st = cublasGemmEx(
            blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &one, wb, CUDA_R_16BF, sh.k, xb,
            CUDA_R_16BF, sh.k, &zero, yb, CUDA_R_16BF, sh.n, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT);
        return st == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
      }, dev.s);
#endif
      for (int overlap = 0; overlap < 2; ++overlap) {
      Args a{w.codes(0), w.scales(0), x.dx, x.dsx, x.dq, out, m, sh.n, sh.k, w.g128, w.gpad};
      CHECK(cudaMemsetAsync(out, 0xFF, int64_t(m) * sh.n * 2, dev.s));  // NaN: unwritten shows
      CHECK(launch(a, overlap, dev.s));
      CHECK(cudaStreamSynchronize(dev.s));
      std::vector<__nv_bfloat16> hy(int64_t(m) * sh.n);
      CHECK(cudaMemcpy(hy.data(), out, hy.size() * 2, cudaMemcpyDeviceToHost));
      double err2 = 0, ref2 = 0;
      for (size_t i = 0; i < rows.size(); ++i)
        for (int t = 0; t < m; ++t) {
          const double r = ref[i * mmax + t];
          const double v = __bfloat162float(hy[int64_t(t) * sh.n + rows[i]]);
          err2 += (v - r) * (v - r);
          ref2 += r * r;
        }
      const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
      if (rel > 1e-2) {  // a layout error: the first checked rows' first tokens, for the pattern
        for (int i = 0; i < 2; ++i) {
          std::printf("{\"row\": %d, \"ref_got\": [", rows[i]);
          for (int t = 0; t < std::min(m, 16); ++t)
            std::printf("%s[%.4g, %.4g]", t ? ", " : "", ref[i * mmax + t],
                        __bfloat162float(hy[int64_t(t) * sh.n + rows[i]]));
          std::printf("]}\n");
        }
      }
      const double us = time_graph(w.calls(), [&](int i) {
        Args b = a;
        b.codes = w.codes(i % w.copies);
        b.scales = w.scales(i % w.copies);
        return launch(b, overlap, dev.s);
      }, dev.s);
      const double tops = 2.0 * m * sh.n * double(sh.k) / us / 1e6;
      std::printf("{\"shape\": \"%dx%d\", \"m\": %d, \"kernel\": \"pq2_wgmma%s\", "
                  "\"us\": %.2f, \"bf16_us\": %.2f, \"vs_bf16\": %.3f, \"tops\": %.0f, "
                  "\"rel_err\": %.3g}\n", sh.n, sh.k, m, overlap ? "_overlap" : "", us, bf16_us,
                  bf16_us > 0 ? bf16_us / us : 0.0, tops, rel);
      std::fflush(stdout);
      }
    }
    CHECK(cudaFree(out));
    CHECK(cudaFree(wb));
    CHECK(cudaFree(xb));
    CHECK(cudaFree(yb));
  }
#ifdef PQ2_WITH_CUBLAS
  cublasDestroy(blas);
#endif
  return 0;
}
