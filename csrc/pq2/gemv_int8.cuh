// PQ2 GEMV for one int8 activation row (M = 1), torch-free; the formula is in pq2_params.cuh.
//
// A CTA owns up to 32 consecutive weight rows and requests all their codes and scales into
// shared memory (cp.async) before it computes anything, so the loads of a multiprocessor's
// whole share of a mid-size matrix are in flight at once; with programmatic dependent launch
// they are issued before the grid-dependency wait. The int8 activation is staged in shared
// memory with its 64-group sums; each warp then reduces one row per round, lane l taking the
// 64-weight groups l, l + 32, ... (4 dp4a per word of 16 codes).
#pragma once

#include "pq2_params.cuh"

namespace vllm_prism {

// Launches y[1, N] for p.m == 1 (p.qsum and p.split are not read; K % 64 == 0).
cudaError_t pq2_gemv_int8_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream);

}  // namespace vllm_prism
