// Programmatic dependent launch (sm_90+), shared by the PQ2 and attention kernels: the launch
// attribute that lets a kernel start while the one before it in the stream finishes, and the
// two device instructions around it (a no-op where the kernel was launched without it, and
// before sm_90).
#pragma once

#include <cuda_runtime.h>

namespace vllm_prism {

// Let the next kernel in the stream (launched with the attribute) start launching.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

// Wait until the kernel before this one has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The programmatic-dependent-launch attribute of a launch config, when `pdl` (`attr` must
// outlive the launch).
inline void set_pdl(cudaLaunchConfig_t& cfg, cudaLaunchAttribute& attr, bool pdl) {
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
}

}  // namespace vllm_prism
