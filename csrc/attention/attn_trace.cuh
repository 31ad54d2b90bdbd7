// A CTA's timeline for the INT8 attention kernels' diagnostics harnesses
// (benchmarks/kernels/verify_trace.cu, decode_trace.cu): the SM's clock (or %globaltimer) at
// points of a kernel, written to a buffer of `stride` words a CTA. Compiled in only where the
// translation unit defines PRISM_ATTN_TRACE before including a kernel (the harnesses include
// the kernel's source); in the extension's build every call returns at once, so a call site
// needs no guard of its own, and no trace is left in the kernels' PTX
// (tests/kernels/test_csrc_compile.py checks both kernels).
#pragma once

#include <cstdint>

#ifndef PRISM_ATTN_TRACE
#define PRISM_ATTN_TRACE 0
#endif

namespace vllm_prism {
namespace attn_trace {

constexpr bool kOn = PRISM_ATTN_TRACE != 0;

#if PRISM_ATTN_TRACE
__device__ unsigned long long* g_buf;  // [CTAs][the kernel's stride], set by the harness
#endif

// Records the SM's clock (timer: %globaltimer, ns) at `slot` of this CTA's timeline where the
// trace is compiled in and `who` is the recording thread; slots past `kStride` are dropped.
template <int kStride>
__device__ __forceinline__ void at(bool who, int slot, bool timer = false) {
  if (!kOn || !who || slot >= kStride) return;
#if PRISM_ATTN_TRACE
  const int cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned long long v;
  if (timer) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  else v = clock64();
  g_buf[static_cast<int64_t>(cta) * kStride + slot] = v;
#else
  (void)timer;
#endif
}

// Records the multiprocessor the CTA runs on (%smid) at `slot`, as `at` records a clock: the
// harnesses' reading of the CTAs' spread (which multiprocessors the slow CTAs ran on).
template <int kStride>
__device__ __forceinline__ void sm_at(bool who, int slot) {
  if (!kOn || !who || slot >= kStride) return;
#if PRISM_ATTN_TRACE
  const int cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned int sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  g_buf[static_cast<int64_t>(cta) * kStride + slot] = sm;
#endif
}

}  // namespace attn_trace
}  // namespace vllm_prism
