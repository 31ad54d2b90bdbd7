// PQ2 linear on int8 tensor cores (mma.sync m16n8k32), torch-free: any M, in tiles of up to
// 64 activation rows.
//
// y[m, n] = sum_g d[n, g] * sx[m, g] * (sum_{k in g} c[n, k] * xq[m, k] - qsum[m, g]) (+ bias[n])
// with c in 0..3 the 2-bit code (value c - 1), d the fp16 weight scale of the 128-group g,
// xq the int8 activation, sx its fp32 group scale and qsum its int32 group sum.
//
// The weights are the MMA's B operand (k x 8 rows, "col"): the prepared code word w of a row
// holds elements 16w + 4q + b at bits 8b + 2q (kernels/pq2/layout.py), so lane t of a quad
// gets its B fragment, four consecutive k of one row as bytes, from (w >> 2t) & 0x03030303:
// two instructions per four weights, decoded once and used by every 16-token m-tile. The
// activations are the A operand, staged in shared memory and read with ldmatrix.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace vllm_prism {

// What the launcher needs; dtypes: 0 = float32, 1 = float16, 2 = bfloat16.
struct Pq2MmaParams {
  const int32_t* codes;  // [N, K/16], row stride stride_c (words)
  const uint16_t* scales;  // fp16 [N, >= K/128], row stride stride_s (elements)
  const int8_t* xq;      // [M, K], row stride stride_x (bytes)
  const float* sx;       // [M, >= K/128], row stride stride_g
  const int32_t* qsum;   // [M, >= K/128], row stride stride_g
  const void* bias;      // [N] of bias_dtype, or nullptr
  void* out;             // [M, N] of out_dtype, row stride stride_o; float32 when split > 1
  int m, n, k;
  int64_t stride_c, stride_s, stride_x, stride_g, stride_o;
  int split;             // K splits (atomic fp32 adds into a zeroed out when > 1)
  int out_dtype, bias_dtype;
  bool pdl;              // programmatic dependent launch (sm_90+)
};

// Rows per CTA, K per pipeline stage (K must be a multiple of it).
constexpr int kPq2MmaTileN = 128;
constexpr int kPq2MmaBlockK = 256;

// K splits that fill the GPU: at least two CTAs per multiprocessor, at most one per stage.
int pq2_mma_int8_default_split(int m, int n, int k, int sm_count);

// Launches the kernel on `stream`; returns the CUDA error of the launch.
cudaError_t pq2_mma_int8_launch(const Pq2MmaParams& p, cudaStream_t stream);

}  // namespace vllm_prism
