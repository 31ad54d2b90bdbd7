// The launchers of the PQ2 prefill GEMMs on warpgroup MMA (wgmma_prefill.cuh, wgmma_fold.cuh). This
// file is compiled for sm_90a alone (CMakeLists.txt: the prism_sm90a object library); the torch op
// (wgmma_prefill_op.cu) checks the device before it calls them.
#include "wgmma_fold.cuh"
#include "wgmma_prefill.cuh"
#include "wgmma_prefill_launch.h"

namespace vllm_prism {

namespace {

// Runs quantize(x as the 16-bit type it is, ...).
template <class F>
cudaError_t by_dtype(const void* x, bool x_half, F&& quantize) {
  if (x_half) return quantize(static_cast<const __half*>(x));
  return quantize(static_cast<const __nv_bfloat16*>(x));
}

}  // namespace

cudaError_t pq2_wgmma_quantize(const void* x, bool x_half, int64_t ldx, int m, int k, int8_t* xt,
                               float* sxt, cudaStream_t stream) {
  return by_dtype(x, x_half, [&](const auto* xp) {
    return wgmma_prefill::quantize_tiled(xp, ldx, m, k, xt, sxt, stream);
  });
}

cudaError_t pq2_wgmma_gemm(const Pq2WgmmaParams& p, cudaStream_t stream) {
  return wgmma_prefill::gemm(p, stream);
}

cudaError_t pq2_wgmma_fold_quantize(const void* x, bool x_half, int64_t ldx, int m, int k,
                                    int8_t* xt, float* sxt, cudaStream_t stream) {
  return by_dtype(x, x_half, [&](const auto* xp) {
    return wgmma_prefill::quantize_fold(xp, ldx, m, k, xt, sxt, stream);
  });
}

cudaError_t pq2_wgmma_fold_gemm(const Pq2WgmmaParams& p, cudaStream_t stream) {
  return wgmma_prefill::fold_gemm(p, stream);
}

}  // namespace vllm_prism
