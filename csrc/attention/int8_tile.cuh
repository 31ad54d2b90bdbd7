// Device helpers shared by the INT8 attention kernels (int8_decode.cu, int8_verify.cu): the
// 16-byte / 8-byte cp.async pipeline, int8 -> fp16 operands from the bits, the fp16 MMA, the
// 8x8 transpose that turns an S^T accumulator into a P^T operand, ldmatrix, the slot order
// of a tile, and the launch with programmatic dependent launch (../pdl.cuh); shared-memory
// addresses are ../async_pipeline.cuh's smem_addr.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../async_pipeline.cuh"  // smem_addr
#include "../pdl.cuh"

namespace vllm_prism {
namespace attn {

// The head dimensions the INT8 attention kernels are compiled for.
constexpr bool head_dim_compiled(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// `launch(std::integral_constant<int, HD>{})` for the compiled head dimension HD ==
// `head_dim`; cudaErrorInvalidValue for any other.
template <class F>
cudaError_t for_head_dim(int head_dim, F&& launch) {
  switch (head_dim) {
    case 64: return launch(std::integral_constant<int, 64>{});
    case 128: return launch(std::integral_constant<int, 128>{});
    case 256: return launch(std::integral_constant<int, 256>{});
    default: return cudaErrorInvalidValue;
  }
}

// Slots of a tile: the MMAs' 16 rows (of S^T in verification, of K / V in decode), in the order
// slot_of_row gives.
constexpr int kTileSlots = 16;

constexpr uint32_t kSignFlip = 0x80808080u;
constexpr uint32_t kF16Bias = 0x64806480u;  // fp16 1152 in both halves

__device__ __forceinline__ int slot_of_row(int row) {
  // rows 0..7 -> slots 0 1 2 3 5 4 7 6, rows 8..15 -> 8 + the same
  const int r = row & 7;
  return (row & 8) | (r < 4 ? r : (r ^ 1));
}

// Named barrier `id` (1..15; 0 is __syncthreads) over kThreads threads.
template <int kThreads>
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// The named barrier's OR of `v` over its kThreads threads.
template <int kThreads>
__device__ __forceinline__ bool named_sync_or(int id, bool v) {
  int r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.s32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n"
      " selp.s32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(static_cast<int>(v)), "r"(id), "n"(kThreads)
      : "memory");
  return r != 0;
}

// The two warps sharing a 16-slot tile (the decode kernel: and a KV head) meet at named
// barrier 1 + pair.
__device__ __forceinline__ void pair_sync(int pair) { named_sync<64>(1 + pair); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void cp_async8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Two signed bytes of `flipped` (already ^ 0x80) as an fp16 pair: sel 0x4140 takes bytes 0, 1,
// sel 0x4342 bytes 2, 3.
__device__ __forceinline__ uint32_t f16x2_of(uint32_t flipped, uint32_t sel) {
  const uint32_t h = __byte_perm(flipped, 0x64646464u, sel);
  uint32_t r;
  asm("sub.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(h), "r"(kF16Bias));
  return r;
}

// f16x2_of with the 0x64 filler in a register (`k64`, 0x64646464 the compiler cannot fold) and
// the selector SEL immediate: one PRMT and one HADD2. Where registers are short, a literal
// filler makes the compiler re-materialise the selector before every PRMT (int8_verify.cu).
template <uint32_t SEL>
__device__ __forceinline__ uint32_t f16x2_sel(uint32_t flipped, uint32_t k64) {
  uint32_t h, r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(h) : "r"(flipped), "r"(k64), "n"(SEL));
  asm("sub.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(h), "r"(kF16Bias));
  return r;
}

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two 8x8 fp16 matrices from shared memory: lanes 0..15 give the addresses of row l % 8 of
// matrix l / 8; r[j] is matrix j in the MMA's operand layout (lane (g, t): row g, columns 2t,
// 2t + 1).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

__device__ __forceinline__ uint32_t transpose8x8(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float ld_f32(const uint8_t* p) {
  return *reinterpret_cast<const float*>(p);
}

__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// 8 query values (fp16 or bf16, as loaded: `raw`), scaled, as floats.
__device__ __forceinline__ void q8_f32(const uint4& raw, int dtype, float scale, float (&v)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = dtype == 2
                         ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]))
                         : __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    v[2 * i] = f.x * scale;
    v[2 * i + 1] = f.y * scale;
  }
}

// 8 query values from `q` (fp16 or bf16), scaled, as floats.
__device__ __forceinline__ void load_q8_f32(const void* q, int dtype, float scale,
                                            float (&v)[8]) {
  q8_f32(*reinterpret_cast<const uint4*>(q), dtype, scale, v);
}

// 8 query values from `q` (fp16 or bf16) scaled into fp16 pairs.
__device__ __forceinline__ void load_q8(const void* q, int dtype, float scale, uint32_t (&h)[4]) {
  float v[8];
  load_q8_f32(q, dtype, scale, v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = pack_f16x2(v[2 * i], v[2 * i + 1]);
}

// Four values rounded to int8 (|x| <= 127 expected) in one word, the first in the low byte.
__device__ __forceinline__ uint32_t pack_s8x4(float a, float b, float c, float d) {
  const uint32_t ia = static_cast<uint32_t>(__float2int_rn(a)) & 0xffu;
  const uint32_t ib = static_cast<uint32_t>(__float2int_rn(b)) & 0xffu;
  const uint32_t ic = static_cast<uint32_t>(__float2int_rn(c)) & 0xffu;
  const uint32_t id = static_cast<uint32_t>(__float2int_rn(d)) & 0xffu;
  return ia | (ib << 8) | (ic << 16) | (id << 24);
}

// D = A . B + D on the int8 tensor cores (m16n8k32, s32 accumulators): a0..a3 hold rows g and
// g + 8 at k 4t..4t+3 (a0, a1) and 16+4t.. (a2, a3), b0 / b1 column g at the same k.
__device__ __forceinline__ void mma16832_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void store_out(void* out, int dtype, const float (&v)[4]) {
  if (dtype == 2) {
    __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]);
    __nv_bfloat162 b = __floats2bfloat162_rn(v[2], v[3]);
    uint2 u = {*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&b)};
    *reinterpret_cast<uint2*>(out) = u;
  } else {
    __half2 a = __floats2half2_rn(v[0], v[1]);
    __half2 b = __floats2half2_rn(v[2], v[3]);
    uint2 u = {*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&b)};
    *reinterpret_cast<uint2*>(out) = u;
  }
}

// Four consecutive values of a segment's partial output at element `i` of part_o: fp32
// (dtype 0, 16 bytes), fp16 (1) or bf16 (2; 8 bytes; the merge kernel reads each). A partial
// is normalized (a convex combination of the segment's V rows); fp16 saturates at its largest
// finite value instead of becoming inf, which the merge would turn into NaN.
__device__ __forceinline__ void store_partial(void* part_o, int dtype, int64_t i,
                                              const float (&v)[4]) {
  if (dtype == 1) {
    constexpr float kMax = 65504.f;
    const float c[4] = {fminf(fmaxf(v[0], -kMax), kMax), fminf(fmaxf(v[1], -kMax), kMax),
                        fminf(fmaxf(v[2], -kMax), kMax), fminf(fmaxf(v[3], -kMax), kMax)};
    store_out(static_cast<uint8_t*>(part_o) + i * 2, 1, c);
  } else if (dtype == 2) {
    store_out(static_cast<uint8_t*>(part_o) + i * 2, 2, v);
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(part_o) + i) = make_float4(v[0], v[1], v[2],
                                                                             v[3]);
  }
}

// Launch `kernel(kp)` on `grid` x `threads` with `smem` bytes of dynamic shared memory, with the
// programmatic-dependent-launch attribute where p.pdl (1 or 2); `kp` is the kernel's parameter:
// p itself, or a struct that holds it (the warpgroup-MMA verification kernel's).
template <class KParams>
cudaError_t launch_kernel(void (*kernel)(KParams), dim3 grid, int threads, int smem,
                          cudaStream_t stream, const Int8AttnParams& p, const KParams& kp) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(cfg, attr, p.pdl != 0);
  return cudaLaunchKernelEx(&cfg, kernel, kp);
}

// Let the next kernel launch, at the kernel's start (p.pdl 1) or after its stage loop (2).
__device__ __forceinline__ void pdl_trigger(int pdl, int at) {
  if (pdl == at) pdl_launch_dependents();
}

}  // namespace attn
}  // namespace vllm_prism
