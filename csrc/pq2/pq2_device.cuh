// Device helpers shared by the PQ2 kernels of csrc/pq2: programmatic dependent launch, cp.async,
// the exact int32 -> fp32 conversion, and loads/stores of the dtypes Pq2LinearParams names.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "pq2_params.cuh"

namespace vllm_prism {

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// cp.async (sm_80+): global -> shared copies that bypass the registers, waited on by commit
// group.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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
