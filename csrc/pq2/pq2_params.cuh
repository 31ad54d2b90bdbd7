// The arguments every PQ2 linear kernel of csrc/pq2 takes, torch-free.
//
// y[m, n] = sum_g d[n, g] * sx[m, g] * (sum_{k in g} c[n, k] * xq[m, k] - qsum[m, g]) (+ bias[n])
// with c in 0..3 the 2-bit code (value c - 1) of the prepared word layout (element 16w + 4q + b
// at bits 8b + 2q of word w: kernels/pq2/layout.py), d the fp16 weight scale of the 128-group
// g, xq the int8 activation, sx its fp32 group scale and qsum its int32 group sum.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "../pdl.cuh"

namespace vllm_prism {

// dtypes: 0 = float32, 1 = float16, 2 = bfloat16.
struct Pq2LinearParams {
  const int32_t* codes;    // [N, K/16], row stride stride_c (words)
  const uint16_t* scales;  // fp16 [N, >= K/128], row stride stride_s (elements)
  const int8_t* xq;        // [M, K], row stride stride_x (bytes)
  const float* sx;         // [M, >= K/128], row stride stride_g
  const int32_t* qsum;     // [M, >= K/128], row stride stride_g (kernels that need it)
  const void* bias;        // [N] of bias_dtype, or nullptr
  void* out;               // [M, N] of out_dtype, row stride stride_o
  int m, n, k;
  int64_t stride_c, stride_s, stride_x, stride_g, stride_o;
  int split;               // K splits: partial sums meet in `workspace`, the last CTA of a
                           // tile (counted in `counters`) adds them up and stores
  float* workspace;        // split > 1: [split, tiles, threads, values per thread]
  int* counters;           // split > 1: one per tile, zero before the launch and after it
  int out_dtype, bias_dtype;
  bool pdl;                // programmatic dependent launch (sm_90+)
};

// `v` rounded up to a multiple of 16 (shared-memory offsets of 16-byte copies).
__host__ __device__ constexpr int align16(int v) { return (v + 15) & ~15; }

// The largest dynamic shared memory one block may opt in to on the current device, bytes
// (227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on sm_86 / sm_89), read once per device.
inline int max_dynamic_smem_per_block() {
  static int cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 48 * 1024;
  if (cached[dev] == 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      return 48 * 1024;
    }
    cached[dev] = v;
  }
  return cached[dev];
}

}  // namespace vllm_prism
