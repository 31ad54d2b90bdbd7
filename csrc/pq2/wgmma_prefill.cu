// The launchers of the PQ2 prefill GEMM on warpgroup MMA (wgmma_prefill.cuh). This file is
// compiled for sm_90a alone (CMakeLists.txt: the prism_sm90a object library); the torch op
// (wgmma_prefill_op.cu) checks the device before it calls them.
#include "wgmma_prefill.cuh"
#include "wgmma_prefill_launch.h"

namespace vllm_prism {

cudaError_t pq2_wgmma_quantize(const void* x, bool x_half, int64_t ldx, int m, int k, int8_t* xt,
                               float* sxt, cudaStream_t stream) {
  if (x_half)
    return wgmma_prefill::quantize_tiled(static_cast<const __half*>(x), ldx, m, k, xt, sxt,
                                         stream);
  return wgmma_prefill::quantize_tiled(static_cast<const __nv_bfloat16*>(x), ldx, m, k, xt, sxt,
                                       stream);
}

cudaError_t pq2_wgmma_gemm(const Pq2WgmmaParams& p, cudaStream_t stream) {
  return wgmma_prefill::gemm(p, stream);
}

}  // namespace vllm_prism
