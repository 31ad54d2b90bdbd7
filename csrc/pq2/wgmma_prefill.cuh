// The PQ2 prefill GEMM on Hopper's warpgroup MMA (sm_90a), fused with the weights' decoding:
// y[m, n] = sum_g d[n, g] * sx[m, g] * sum_{k in g} (c[n, k] - 1) * xq[m, k]
// (csrc/pq2/pq2_params.cuh's formula with the codes made signed in registers, so the token's
// group sum is not needed), with the activation quantized to int8 per token and 128-group
// first (quantize_tiled, the layout below).
//
// The activation's tiled layout (what quantize_tiled writes and the GEMM copies in one bulk
// copy a group): for a tile of 128 tokens and a 128-group of K, a 16 KiB block in wgmma's
// K-major no-swizzle core-matrix order, byte (t, kb) of the block at
// (t >> 3) * 1024 + (kb >> 4) * 128 + (t & 7) * 16 + (kb & 15); blocks [tile][group]. The
// scales sx: [tile][group][128] fp32. Tokens past M are zeros.
//
// A CTA computes 128 weight rows x 128 tokens: one producer warp and two consumer warpgroups
// (64 rows each), with kStages stage buffers and two mbarriers a stage (full: the copies'
// bytes arrived; empty: the eight consumer warps are done with it):
// * the producer copies a group's activation block and its 128 scales with cp.async.bulk,
//   the rows' 32 bytes of codes with cp.async;
// * a consumer lane decodes its A fragment (rows g and g + 8, k 4t.. and 16 + 4t.. of a
//   32-wide step) from the code words ((word >> 2t) & 0x03030303, then c - 1 bytewise), issues
//   four wgmma.m64n128k32.s32.s8.s8, waits, and promotes the int32 sums into fp32
//   accumulators with the row's and the token's scales (I2FP.F32.S32: 6-8 % faster on the
//   H200 than the 0x4B400000-bias conversion, which takes an add and a subtract); the two
//   warpgroups are not kept in step, so one's MMAs run while the other promotes.
// The weight scales are read from global one group ahead, into registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "pq2_device.cuh"
#include "wgmma_prefill_launch.h"

namespace vllm_prism {
namespace wgmma_prefill {

constexpr int kRows = 128;                  // weight rows a CTA
constexpr int kTok = 128;                   // tokens a CTA (wgmma N), the tile of the layout
constexpr int kConsumers = 256;             // two warpgroups
constexpr int kThreads = kConsumers + 32;   // and the producer warp
constexpr int kStages = 4;                  // 6 and 8 were no faster (H200)
constexpr int kBBytes = kTok * 128;         // a group's activation block: 16 KiB
constexpr int kABytes = kRows * 32;         // the rows' codes of a group: 4 KiB
constexpr int kSBytes = kTok * 4;           // the tokens' scales of a group
constexpr int kStageBytes = kBBytes + kABytes + kSBytes;
constexpr int kSmem = kStages * (kStageBytes + 16);  // the stages and their two barriers

using Params = Pq2WgmmaParams;

// Byte offset of token `tok`, K index `k` in the tiled activation of `groups` groups.
__host__ __device__ __forceinline__ int64_t tiled_offset(int tok, int k, int groups) {
  const int t = tok & 127, kb = k & 127;
  return ((int64_t(tok >> 7) * groups + (k >> 7)) << 14) + (t >> 3) * 1024 + (kb >> 4) * 128 +
         (t & 7) * 16 + (kb & 15);
}

// K-major, no swizzle: start address, LBO 128 B (next core matrix along K), SBO 1024 B (next
// 8 tokens).
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

// The asynchronous MMA reads its A registers and writes its sums after the issuing statement
// returns: an empty asm that "writes" a register keeps every use of it on its side of the
// fences and waits.
__device__ __forceinline__ void fence_reg(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(int32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// Signed weights c - 1 of four code bytes c in 0..3 (-1..2; PQ2_0 uses all four codes):
// (c + 0x7F) ^ 0x80 bytewise, no carries.
__device__ __forceinline__ uint32_t signed_codes(uint32_t word, int shift) {
  return (((word >> shift) & 0x03030303u) + 0x7F7F7F7Fu) ^ 0x80808080u;
}

// One group: the lane's A fragments from the stage's codes, four MMAs into `d`, waited for.
__device__ __forceinline__ void group_mma(const char* buf, int row_a, int tq, int32_t (&d)[64]) {
  const uint4* codes = reinterpret_cast<const uint4*>(buf + kBBytes);
  const uint4 w0a = codes[row_a * 2], w0b = codes[row_a * 2 + 1];
  const uint4 w1a = codes[(row_a + 8) * 2], w1b = codes[(row_a + 8) * 2 + 1];
  const uint32_t r0w[8] = {w0a.x, w0a.y, w0a.z, w0a.w, w0b.x, w0b.y, w0b.z, w0b.w};
  const uint32_t r1w[8] = {w1a.x, w1a.y, w1a.z, w1a.w, w1b.x, w1b.y, w1b.z, w1b.w};
  uint32_t a[4][4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    a[c][0] = signed_codes(r0w[2 * c], 2 * tq);
    a[c][1] = signed_codes(r1w[2 * c], 2 * tq);
    a[c][2] = signed_codes(r0w[2 * c + 1], 2 * tq);
    a[c][3] = signed_codes(r1w[2 * c + 1], 2 * tq);
  }
  const uint64_t desc = b_desc(buf);
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_reg(d[i]);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int c = 0; c < 4; ++c) wgmma_s8(d, a[c], desc + uint64_t((c * 256) >> 4), c > 0);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_reg(d[i]);
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i) fence_reg(a[c][i]);
}

// A group's sums into the accumulators: element 4j + 2h + e of a lane is row row_a + 8h,
// token 8j + 2tq + e; w0 / w1 the rows' scales.
__device__ __forceinline__ void promote(const char* buf, int tq, float w0, float w1,
                                        const int32_t (&d)[64], float (&acc)[64]) {
  const float* sx = reinterpret_cast<const float*>(buf + kBBytes + kABytes);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 s = *reinterpret_cast<const float2*>(sx + 8 * j + 2 * tq);
    const float p00 = w0 * s.x, p01 = w0 * s.y, p10 = w1 * s.x, p11 = w1 * s.y;
    acc[4 * j + 0] += p00 * __int2float_rn(d[4 * j + 0]);  // I2FP: one ALU instruction
    acc[4 * j + 1] += p01 * __int2float_rn(d[4 * j + 1]);
    acc[4 * j + 2] += p10 * __int2float_rn(d[4 * j + 2]);
    acc[4 * j + 3] += p11 * __int2float_rn(d[4 * j + 3]);
  }
}

// 16 bytes global -> shared by the LSU (zeros where `valid` is false); the thread's copies
// arrive on `bar` when done (copy_arrive, ../async_pipeline.cuh).
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// The producer warp: a group's activation block and scales by two bulk copies (the TMA
// unit: one 16 KiB request), the 128 rows' 32 bytes of codes by the lanes' cp.async (128
// small bulk requests a group kept the TMA unit busy for longer than the MMAs took). The
// tokens' scales are [tile][group / scale_groups][128] (scale_groups: 1, or wgmma_fold.cuh's
// 8 a 1024-block).
__device__ __forceinline__ void produce(const Params& p, char* smem, uint64_t* full,
                                        uint64_t* empty, int scale_groups = 1) {
  const int lane = threadIdx.x & 31;
  const int r0 = blockIdx.x * kRows, tile = blockIdx.y;
  const int64_t words = p.k / 16;
  const int scale_blocks = (p.groups + scale_groups - 1) / scale_groups;
  for (int g = 0; g < p.groups; ++g) {
    const int s = g % kStages;
    mbar_wait(&empty[s], ((g / kStages) & 1) ^ 1);
    char* buf = smem + s * kStageBytes;
    if (lane == 0) {
      mbar_expect_tx(&full[s], kBBytes + kSBytes);
      const int64_t blk = int64_t(tile) * p.groups + g;
      bulk_copy(buf, p.xt + (blk << 14), kBBytes, &full[s]);
      bulk_copy(buf + kBBytes + kABytes,
                p.sxt + ((int64_t(tile) * scale_blocks + g / scale_groups) << 7), kSBytes,
                &full[s]);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = lane + 32 * i, row = c >> 1;
      const bool ok = r0 + row < p.n;
      copy16(buf + kBBytes + c * 16, p.codes + (ok ? r0 + row : 0) * words + g * 8 + (c & 1) * 4,
             ok);
    }
    copy_arrive(&full[s]);
  }
}

// The stages' full / empty mbarriers after the stage buffers, initialised by thread 0; every
// thread returns the full ones (the empty ones follow).
__device__ __forceinline__ uint64_t* init_stage_barriers(char* smem) {
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1 + 32);  // the expect_tx arrival and the producer lanes' copies
      mbar_init(&full[kStages + s], kConsumers / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  return full;
}

// The CTA's output: element 4j + 2r + e of acc is row row_a + 8r, token 8j + 2tq + e.
__device__ __forceinline__ void store_tile(const Params& p, const float (&acc)[64], int row_a,
                                           int tq) {
  const int r0 = blockIdx.x * kRows, t0 = blockIdx.y * kTok;
  const bool ok0 = r0 + row_a < p.n, ok1 = r0 + row_a + 8 < p.n;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int tok = t0 + 8 * j + 2 * tq + e;
      if (tok >= p.m) continue;
      const int64_t o = int64_t(tok) * p.ldo + r0 + row_a;
      if (p.out_half) {
        __half* out = static_cast<__half*>(p.out);
        if (ok0) out[o] = __float2half_rn(acc[4 * j + e]);
        if (ok1) out[o + 8] = __float2half_rn(acc[4 * j + 2 + e]);
      } else {
        __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
        if (ok0) out[o] = __float2bfloat16_rn(acc[4 * j + e]);
        if (ok1) out[o + 8] = __float2bfloat16_rn(acc[4 * j + 2 + e]);
      }
    }
}

// A 16-value chunk of token `tok`'s row at column `col` as floats (zeros past M).
template <typename T>
__device__ __forceinline__ void load_chunk(const T* x, int64_t ldx, int tok, int m, int col,
                                           float (&v)[16]) {
  uint4 raw[sizeof(T)];  // 16 values: 2 (16-bit) or 4 (fp32) uint4
#pragma unroll
  for (int i = 0; i < int(sizeof(T)); ++i) raw[i] = make_uint4(0, 0, 0, 0);
  if (tok < m) {
    const uint4* src = reinterpret_cast<const uint4*>(x + tok * ldx + col);
#pragma unroll
    for (int i = 0; i < int(sizeof(T)); ++i) raw[i] = src[i];
  }
  const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(e[i]);
}

template <typename T>
__device__ __forceinline__ void zero64(T (&x)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) x[i] = T(0);
}

// A consumer lane's place: its lane, k quarter tq, first row row_a of the CTA (and row_a + 8),
// whether those rows exist, and their scale rows (row 0's where not).
struct Lane {
  int lane, tq, row_a;
  bool ok0, ok1;
  const uint16_t *s0, *s1;
};
__device__ __forceinline__ Lane consumer_lane(const Params& p) {
  Lane l;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
  l.lane = threadIdx.x & 31;
  l.tq = l.lane & 3;
  l.row_a = wg * 64 + warp * 16 + (l.lane >> 2);
  const int r0 = blockIdx.x * kRows;
  l.ok0 = r0 + l.row_a < p.n;
  l.ok1 = r0 + l.row_a + 8 < p.n;
  l.s0 = p.scales + int64_t(l.ok0 ? r0 + l.row_a : 0) * p.gpad;
  l.s1 = p.scales + int64_t(l.ok1 ? r0 + l.row_a + 8 : 0) * p.gpad;
  return l;
}

__global__ void __launch_bounds__(kThreads, 1) gemm_kernel(const Params p) {
  extern __shared__ __align__(1024) char smem[];
  uint64_t* full = init_stage_barriers(smem);
  uint64_t* empty = full + kStages;
  if (threadIdx.x >= kConsumers) {
    produce(p, smem, full, empty);
    return;
  }
  const Lane l = consumer_lane(p);
  const int lane = l.lane, tq = l.tq, row_a = l.row_a;
  const bool ok0 = l.ok0, ok1 = l.ok1;
  const uint16_t *s0 = l.s0, *s1 = l.s1;
  float acc[64];  // the fp32 sums and the warpgroup's int32 ones
  int32_t d[64];
  zero64(acc);
  zero64(d);
  uint16_t n0 = s0[0], n1 = s1[0];
  for (int g = 0; g < p.groups; ++g) {
    const float w0 = ok0 ? __half2float(__ushort_as_half(n0)) : 0.f;
    const float w1 = ok1 ? __half2float(__ushort_as_half(n1)) : 0.f;
    if (g + 1 < p.groups) {
      n0 = s0[g + 1];
      n1 = s1[g + 1];
    }
    const int s = g % kStages;
    mbar_wait(&full[s], (g / kStages) & 1);
    const char* buf = smem + s * kStageBytes;
    group_mma(buf, row_a, tq, d);
    promote(buf, tq, w0, w1, d, acc);
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
  }
  store_tile(p, acc, row_a, tq);
}

// MMA k position p of a 16-wide chunk holds K index fold_perm(p) of the chunk in wgmma_fold.cuh's
// layout: 0,8,1,9 / 4,12,5,13 / 2,10,3,11 / 6,14,7,15 by k quarter.
__host__ __device__ __forceinline__ int fold_perm(int p) {
  return ((p >> 2) & 1) * 4 + ((p >> 3) & 1) * 2 + ((p & 1) << 3) + ((p >> 1) & 1);
}

// max |v| of a token's group over the four lanes that hold it (lanes r, r + 8, r + 16, r + 24).
__device__ __forceinline__ float group_amax(const float (&v)[2][16]) {
  float amax = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[h][i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 8));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 16));
  return amax;
}

// A lane's two chunks (jq and jq + 4) of token r as int8 (v * inv, the producers' rounding)
// into the group's block of core rows (`block`: the 8 tokens' first row); PERM: each chunk's
// bytes in fold_perm order.
template <bool PERM>
__device__ __forceinline__ void write_chunks(int8_t* block, const float (&v)[2][16], float inv,
                                             int r, int jq) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 16; ++i)
      w[i >> 2] |= (static_cast<uint32_t>(round_q8(v[h][PERM ? fold_perm(i) : i] * inv)) & 0xffu)
                   << (8 * (i & 3));
    *reinterpret_cast<uint4*>(block + (jq + 4 * h) * 128 + r * 16) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// int8 per token and 128-group (scale max|x| / 127, round half away from zero: the
// producers' rule, producer_device.cuh) into the tiled layout. A warp takes 8 tokens (one row
// of core matrices) of a group: lane 8j' + r reads token r's 16-value chunks j' and j' + 4
// and writes them where 512 contiguous bytes a pass land; tokens past M are zeros.
template <typename T>
__global__ void quantize_tiled_kernel(const T* __restrict__ x, int64_t ldx, int m, int k,
                                      int m_pad, int8_t* __restrict__ xt,
                                      float* __restrict__ sxt) {
  const int groups = k / 128;
  const int64_t unit = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (unit >= int64_t(m_pad / 8) * groups) return;
  const int lane = threadIdx.x & 31, r = lane & 7, jq = lane >> 3;
  const int tok = int(unit / groups) * 8 + r, g = int(unit % groups);
  float v[2][16];
#pragma unroll
  for (int h = 0; h < 2; ++h) load_chunk(x, ldx, tok, m, g * 128 + (jq + 4 * h) * 16, v[h]);
  const float amax = group_amax(v);
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  write_chunks<false>(xt + tiled_offset(tok, g * 128, groups) - (tok & 7) * 16, v, inv, r, jq);
  if (jq == 0) sxt[((int64_t(tok >> 7) * groups + g) << 7) + (tok & 127)] = amax / 127.f;
}

template <typename T>
inline cudaError_t quantize_tiled(const T* x, int64_t ldx, int m, int k, int8_t* xt,
                                  float* sxt, cudaStream_t stream) {
  const int m_pad = (m + 127) / 128 * 128;
  const int64_t threads = int64_t(m_pad / 8) * (k / 128) * 32;
  quantize_tiled_kernel<T><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(x, ldx, m, k,
                                                                                m_pad, xt, sxt);
  return cudaGetLastError();
}

// A GEMM kernel of `threads` over 128-row x 128-token CTAs.
inline cudaError_t launch_gemm(void (*kernel)(Params), int threads, const Params& p,
                               cudaStream_t stream) {
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  const dim3 grid((p.n + kRows - 1) / kRows, (p.m + kTok - 1) / kTok);
  kernel<<<grid, threads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

// Needs K % 128 == 0 (16-byte aligned rows of codes) and the tiled buffers of quantize_tiled.
inline cudaError_t gemm(const Params& p, cudaStream_t stream) {
  return launch_gemm(gemm_kernel, kThreads, p, stream);
}

}  // namespace wgmma_prefill
}  // namespace vllm_prism
