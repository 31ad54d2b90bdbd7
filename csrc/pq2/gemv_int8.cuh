// PQ2 GEMV for one int8 activation row (M = 1), torch-free; the formula is in pq2_params.cuh.
//
// Each warp streams whole weight rows: lane l reads the 16-byte code groups l, l + 32, l + 64
// of its K slice (64 weights each) and keeps the matching 64 activation bytes in registers, so
// a word of 16 codes costs 4 dp4a (partners (word >> 2q) & 0x03030303 and activation int32 q)
// plus 3 shifts and 4 ANDs. Four rows are in flight per warp (a register ring), and with
// programmatic dependent launch the first four rows' loads are issued before the wait.
#pragma once

#include "pq2_params.cuh"

namespace vllm_prism {

// Launches y[1, N] for p.m == 1 (p.qsum and p.split are not read; K % 64 == 0).
cudaError_t pq2_gemv_int8_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream);

}  // namespace vllm_prism
