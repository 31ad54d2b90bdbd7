// Device helpers shared by the PQ2 kernels of csrc/pq2: programmatic dependent launch (../pdl.cuh),
// cp.async, the int8 mma.sync (and one 128-group in the permuted k order), accumulator fills,
// the exact int32 -> fp32 conversion, and loads/stores of the dtypes Pq2LinearParams names.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../async_pipeline.cuh"
#include "pq2_params.cuh"

namespace vllm_prism {

// cp.async (sm_80+): global -> shared copies that bypass the registers, waited on by commit
// group (smem_addr: ../async_pipeline.cuh).

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(dst)), "l"(src));
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Waits until at most `n` of this thread's commit groups are pending, `n` known only at run
// time: above 15 it waits for 15 (stricter, never looser).
__device__ __forceinline__ void cp_async_wait_at_most(int n) {
  switch (n < 0 ? 0 : n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    case 7: cp_async_wait<7>(); break;
    case 8: cp_async_wait<8>(); break;
    case 9: cp_async_wait<9>(); break;
    case 10: cp_async_wait<10>(); break;
    case 11: cp_async_wait<11>(); break;
    case 12: cp_async_wait<12>(); break;
    case 13: cp_async_wait<13>(); break;
    case 14: cp_async_wait<14>(); break;
    default: cp_async_wait<15>(); break;
  }
}

// c += a (16 x 32 int8, row) * b (32 x 8 int8, col), int32 accumulate.
__device__ __forceinline__ void mma_s8(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Word i (0..3) of a 16-byte register quad.
__device__ __forceinline__ uint32_t word_of(const uint4& q, int i) {
  return i == 0 ? q.x : (i == 1 ? q.y : (i == 2 ? q.z : q.w));
}

// The int32 sums of one 128-group of a 16-row tile against NT tiles of 8 tokens, with the
// MMA's k index permuted within the group (mma_small.cu STREAM, mma_bulk.cu): lane (g, t)
// holds bytes 8t .. 8t + 7 of the group's 32 bytes of codes of rows g (w0) and g + 8 (w1), and
// the 32 activation bytes at 32t of the group of its B token of each token tile (bx). At step
// c (0..3) the MMA's k 4t + b is the group's element 32t + 8c + b and k 16 + 4t + b its
// element 32t + 8c + 4 + b, so a lane's A fragments are its own bytes: word c / 2, shifted by
// 4 (c % 2) and 4 (c % 2) + 2, masked to the 2-bit codes (values 0..2, the weight plus one).
template <int NT>
__device__ __forceinline__ void mma_group_permuted(int32_t (&isum)[NT][4], const uint2& w0,
                                                   const uint2& w1, const uint4 (&bx)[NT][2]) {
  constexpr uint32_t kMask = 0x03030303u;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) isum[nt][e] = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint32_t wg = c < 2 ? w0.x : w0.y;
    const uint32_t wh = c < 2 ? w1.x : w1.y;
    const int sh = 4 * (c & 1);
    uint32_t a[4];
    a[0] = (wg >> sh) & kMask;        // row g, group element 32t + 8c + b
    a[1] = (wh >> sh) & kMask;        // row g + 8
    a[2] = (wg >> (sh + 2)) & kMask;  // row g, element 32t + 8c + 4 + b
    a[3] = (wh >> (sh + 2)) & kMask;  // row g + 8
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma_s8(isum[nt], a, word_of(bx[nt][c >> 1], 2 * (c & 1)),
             word_of(bx[nt][c >> 1], 2 * (c & 1) + 1));
    }
  }
}

// Every element of a [A][B] register array (accumulators) set to `v`.
template <typename T, int A, int B>
__device__ __forceinline__ void fill(T (&a)[A][B], T v) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j) a[i][j] = v;
}

// Every element of a [A][B][C] register array (accumulators) set to `v`.
template <typename T, int A, int B, int C>
__device__ __forceinline__ void fill(T (&a)[A][B][C], T v) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j)
#pragma unroll
      for (int e = 0; e < C; ++e) a[i][j][e] = v;
}

// The activations' int8 rule: t = x * 127 / max|x| rounded half away from zero, clamped to 127.
__device__ __forceinline__ int round_q8(float t) {
  const int qa = min(static_cast<int>(fabsf(t) + 0.5f), 127);
  return t < 0.f ? -qa : qa;
}

// Exact int32 -> fp32 for |v| < 2^22: one integer and one float add.
__device__ __forceinline__ float exact_float(int32_t v) {
  return __int_as_float(v + 0x4B400000) - 12582912.0f;
}

__device__ __forceinline__ float load_as_float(const void* p, int64_t i, int dtype) {
  if (dtype == 1) return __half2float(static_cast<const __half*>(p)[i]);
  if (dtype == 2) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void store_out(const Pq2LinearParams& p, int64_t i, float v) {
  if (p.out_dtype == 1) {
    static_cast<__half*>(p.out)[i] = __float2half_rn(v);
  } else if (p.out_dtype == 2) {
    static_cast<__nv_bfloat16*>(p.out)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p.out)[i] = v;
  }
}

}  // namespace vllm_prism
