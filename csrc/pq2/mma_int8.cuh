// PQ2 linear on int8 tensor cores (mma.sync m16n8k32), torch-free: any M, in tiles of up to
// 64 activation rows; the formula is in pq2_params.cuh.
//
// The weights are the MMA's B operand (k x 8 rows, "col"): the prepared code word w of a row
// holds elements 16w + 4q + b at bits 8b + 2q (kernels/pq2/layout.py), so lane t of a quad
// gets its B fragment, four consecutive k of one row as bytes, from (w >> 2t) & 0x03030303:
// two instructions per four weights, decoded once and used by every 16-token m-tile. The
// activations are the A operand, staged in shared memory and read with ldmatrix.
#pragma once

#include "pq2_params.cuh"

namespace vllm_prism {

// Rows per CTA, K per pipeline stage (K must be a multiple of it).
constexpr int kPq2MmaTileN = 128;
constexpr int kPq2MmaBlockK = 256;

// K splits that fill the GPU: at least two CTAs per multiprocessor, at most one per stage.
int pq2_mma_int8_default_split(int m, int n, int k, int sm_count);

// Output tiles of a launch (one split counter each), and the fp32 workspace a K split needs.
int64_t pq2_mma_int8_tiles(int m, int n);
int64_t pq2_mma_int8_workspace_floats(int m, int n, int split);

// Launches the kernel on `stream`; returns the CUDA error of the launch.
cudaError_t pq2_mma_int8_launch(const Pq2LinearParams& p, cudaStream_t stream);

}  // namespace vllm_prism
