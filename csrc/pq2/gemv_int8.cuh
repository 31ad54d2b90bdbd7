// PQ2 GEMV for 1..4 int8 activation rows (M = 1 decode; a few streams or a short verify
// step), torch-free; the formula is in pq2_params.cuh.
//
// Weights stream global -> registers, 16 bytes per load, every load of a row issued at once;
// LANES lanes share a row, warps walk the rows grid-stride, the activation is staged once per
// CTA in shared memory with its 64-chunk sums; each weight chunk in registers serves every
// activation row (gemv_int8.cu).
#pragma once

#include "pq2_params.cuh"
#include "producer.cuh"

namespace vllm_prism {

constexpr int kPq2GemvMaxM = 4;
// The most int8 activation bytes (M x K) a CTA stages: with their sums and scales about 78 KiB,
// under the 99 KiB a block may take on sm_86 / sm_89 (dispatch.py GEMV_CUDA_MAX_MK).
constexpr int kPq2GemvMaxMK = 73728;

// How a launch is laid out: `lanes` lanes per row (8, 16 or 32), `cmax` 64-weight chunks a
// lane holds per pass, the load cache policy `hint` (0 default, 1 no L1 allocation, 2 that and
// a 256-byte L2 prefetch), `prefetch` (the next row's loads before the current row's sums),
// `warps` per CTA, and at most `ctas_per_sm` CTAs per multiprocessor (0: one warp per row
// group, no grid-stride). Only the configurations gemv_int8.cu compiles launch.
struct GemvConfig {
  int lanes = 16;
  int cmax = 5;
  int hint = 1;
  bool prefetch = false;
  int warps = 8;
  int ctas_per_sm = 0;
};

// The configuration pq2_gemv_int8_launch uses for an N x K matrix and M activation rows.
GemvConfig pq2_gemv_default_config(int n, int k, int m);

// Launches y[M, N] for 1 <= p.m <= kPq2GemvMaxM (p.qsum and p.split are not read;
// K % 64 == 0).
cudaError_t pq2_gemv_int8_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream);

// The same with an explicit configuration (cudaErrorInvalidValue where it is not compiled).
cudaError_t pq2_gemv_int8_launch_config(const Pq2LinearParams& p, const GemvConfig& cfg,
                                        int sm_count, cudaStream_t stream);

// The widest K a fused launch takes: one 32-value unit per thread of a 1024-thread CTA.
constexpr int kPq2GemvFusedMaxK = 32768;

// Launches y[1, N] = W @ producer(x) (+ bias) with the producer in every CTA (p.xq, p.sx are
// not read; p.m == 1; K % 128 == 0, K <= kPq2GemvFusedMaxK; the Hadamard block divides K
// and is at most 1024; rms_group is 0 or a power of two <= 1024 dividing K).
cudaError_t pq2_gemv_fused_launch(const Pq2LinearParams& p, const Pq2PrologueParams& q,
                                  int sm_count, cudaStream_t stream);

}  // namespace vllm_prism
