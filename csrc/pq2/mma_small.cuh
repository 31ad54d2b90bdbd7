// PQ2 linear for small batches (M = 2..16: several decode streams, a speculative verify step)
// on int8 tensor cores, torch-free; the formula is in pq2_params.cuh.
//
// The weights are the MMA's A operand (16 weight rows of an m16n8k32 tile) and the tokens its
// B operand (one n8 tile for M <= 8, two for M <= 16), so no token padding reaches 16 and a
// weight is decoded once for all tokens: lane (g, t) of a warp takes a0..a3 straight from the
// code words of rows g and g + 8 with one shift and one AND each (element 4q + b of a 16-code
// word sits at bits 8b + 2q). A CTA owns up to 128 consecutive rows over the whole of K and
// requests all their codes and scales into shared memory (cp.async) before it computes, like
// the GEMV (gemv_int8.cuh); its 8 warps split K, each warp reading its K slice of the
// activation once (B fragments through L1) for every row tile of the CTA, and the 8 partial
// sums of an output meet in shared memory.
#pragma once

#include "pq2_params.cuh"

namespace vllm_prism {

constexpr int kPq2SmallMaxM = 16;

// Launches y[M, N] for 1 <= p.m <= 16 (p.split is not read; K % 128 == 0). variant 0: all of a
// CTA's codes land before it computes; 1: each warp's K slice group by group, computed as it
// lands (mma_small.cu, PIPE); the same result bit for bit. 2: no shared-memory staging, each
// warp streams its 16 rows' K slice into registers (mma_small.cu, STREAM; xq 16-byte aligned,
// its row stride a multiple of 16; K slices of up to 10 groups a warp); 3: the same with
// slices of up to 5 groups (more, shorter warps); the same int32 group sums, added in
// another order. 4: one CTA a multiprocessor, each an equal share of the (tile, group) units,
// read through a ring of shared-memory stages (mma_bulk.cu; xq as for 2; p.workspace of
// pq2_mma_bulk_workspace_floats floats and p.counters, zero, one a 16-row tile). 5: 2's warps
// in resident CTAs that walk the matrix, each warp's next loads issued before it computes
// (mma_small.cu, PERSIST; xq as for 2; slices of up to 5 groups a pass). 6: M <= 8, 2's
// loads in short passes at the GEMV's occupancy (mma_lean.cu; see its requirements below).
cudaError_t pq2_mma_small_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream,
                                 int variant = 0);

// Variant 4 (mma_bulk.cu): its launch, and the fp32 workspace it needs.
cudaError_t pq2_mma_bulk_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream);
int pq2_mma_bulk_workspace_floats(int n, int k, int sm_count);

// Variant 6 (mma_lean.cu): M = 1..8, K % 512 == 0, scales 8-byte aligned with a row stride
// that is a multiple of 4, xq as for 2. Its geometry: `ks` warps split a 16-row tile's K
// (whole units of four 128-groups each), `tiles` tiles a CTA, the registers capped at `regs`
// (96 with the prefetch, or 128), `prefetch`: the next unit's loads before the current one's
// compute.
constexpr int kPq2LeanMaxM = 8;
struct LeanConfig {
  int ks = 1, tiles = 1, regs = 96;
  bool prefetch = true;
};
LeanConfig pq2_mma_lean_default_config(int n, int k, int sm_count);
cudaError_t pq2_mma_lean_launch_config(const Pq2LinearParams& p, const LeanConfig& cfg,
                                       cudaStream_t stream);
cudaError_t pq2_mma_lean_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream);

}  // namespace vllm_prism
