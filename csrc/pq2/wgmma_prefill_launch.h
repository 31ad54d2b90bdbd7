// The host side of the PQ2 prefill GEMMs on Hopper's warpgroup MMA (wgmma_prefill.cuh and its
// variant with the weight scales folded into the int8 weights, wgmma_fold.cuh; built for sm_90a
// only in wgmma_prefill.cu): their parameters, the sizes of the tiled activation they read, and
// the launchers the torch ops call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace vllm_prism {

struct Pq2WgmmaParams {
  const int32_t* codes;    // [N, K/16] prepared code words
  const uint16_t* scales;  // fp16 [N, gpad]
  const int8_t* xt;        // tiled int8 activation (wgmma_prefill.cuh)
  const float* sxt;        // tiled scales [tiles][groups][128]
  void* out;               // bf16 or fp16 (out_half) [M, ldo]
  int m, n, k, groups, gpad, ldo;
  int out_half;
  // wgmma_fold only: a block's group scales become D * q with |q| <= fold_levels. 63 keeps
  // (c - 1) * q an int8 for every code, 3 (+2) included; 127 is for code planes with no 3 (a
  // ternary checkpoint's), halving the scales' rounding.
  int fold_levels = 63;
};

// Tokens a tile of the activation's layout; K must be a multiple of 128.
constexpr int kPq2WgmmaTile = 128;

inline int64_t pq2_wgmma_tiled_bytes(int64_t m, int64_t k) {
  return (m + kPq2WgmmaTile - 1) / kPq2WgmmaTile * kPq2WgmmaTile * k;
}
inline int64_t pq2_wgmma_tiled_scales(int64_t m, int64_t k) {
  return (m + kPq2WgmmaTile - 1) / kPq2WgmmaTile * kPq2WgmmaTile * (k / 128);
}

// The fold variant's activation scales: one a token and 1024-block of K.
inline int64_t pq2_wgmma_fold_tiled_scales(int64_t m, int64_t k) {
  return (m + kPq2WgmmaTile - 1) / kPq2WgmmaTile * kPq2WgmmaTile * ((k / 128 + 7) / 8);
}

// x [m, k] (bf16, or fp16 where x_half) with row stride ldx -> int8 per token and 128-group in
// the tiled layout (xt: pq2_wgmma_tiled_bytes, sxt: pq2_wgmma_tiled_scales floats).
cudaError_t pq2_wgmma_quantize(const void* x, bool x_half, int64_t ldx, int m, int k, int8_t* xt,
                               float* sxt, cudaStream_t stream);
// out = the PQ2 weight times the tiled activation.
cudaError_t pq2_wgmma_gemm(const Pq2WgmmaParams& p, cudaStream_t stream);
// The fold variant (wgmma_fold.cuh): int8 per token and 1024-block, in the permuted tiled
// layout (sxt: pq2_wgmma_fold_tiled_scales floats), and its GEMM.
cudaError_t pq2_wgmma_fold_quantize(const void* x, bool x_half, int64_t ldx, int m, int k,
                                    int8_t* xt, float* sxt, cudaStream_t stream);
cudaError_t pq2_wgmma_fold_gemm(const Pq2WgmmaParams& p, cudaStream_t stream);

}  // namespace vllm_prism
