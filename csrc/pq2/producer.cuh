// The PQ2 activation producer in CUDA C++, torch-free: prologue -> signs -> block Hadamard ->
// int8 per 128-group, the operations and their order of the Triton producer
// (vllm_prism/kernels/pq2/hadamard.py). The GEMV with the producer in its launch
// (gemv_int8.cu, M = 1) runs it in each of its CTAs (producer_device.cuh);
// pq2_produce_int8_launch runs it on its own (producer.cu), one CTA per 1024 values of an
// activation row, writing the Q8 layout every int8 kernel reads.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace vllm_prism {

// What the producer computes before the signs, and where its inputs are.
struct Pq2PrologueParams {
  const void* x;           // [K], or [2K] with glu (silu(x[:K]) * x[K:]); rows stride_x apart
  const void* res;         // [K] added, or nullptr; the sum is written to res_out
  void* res_out;           // (the fused GEMV: CTA 0 writes it; on its own: each row's CTA)
  const void* rms_w;       // RMSNorm weight ([K], or [rms_group]), or nullptr: no norm
  const void* gate;        // [K]: times silu(gate) (sigmoid with gate_sigmoid), or nullptr
  const float* signs;      // [K], 16-byte aligned, or nullptr: no sign flip or Hadamard
  void* x_out;             // [K]: the prologue's result before the signs, or nullptr
  float rms_offset, eps, inv_sqrt_b;
  int x_dtype;             // 1 fp16, 2 bf16: x, res, res_out, gate and x_out
  int rms_dtype;           // 0 fp32, 1 fp16, 2 bf16
  int rms_group;           // 0: the norm over the whole row; else over each rms_group values
  int log_b;               // the Hadamard block is 2^log_b values (0: none)
  bool glu, gate_sigmoid;
  bool x_vec, res_vec, gate_vec, xout_vec;  // 16-byte aligned rows: 16-byte loads and stores
  // Row strides in elements (the producer on its own, M rows); res_out and x_out rows are K
  // apart.
  int64_t stride_x, stride_res, stride_gate;
};

// The int8 activation the producer writes on its own: codes [M, K] (rows stride_xq bytes
// apart), the fp32 scale (max|x| / 127) and int32 code sum of every 128-group [M, K / 128]
// (rows stride_g apart).
struct Pq2ProducerOut {
  int8_t* xq;
  float* sx;
  int32_t* qsum;
  int64_t stride_xq, stride_g;
};

// Runs the producer on M rows of K values (K % 128 == 0; the Hadamard block at most 1024 and
// dividing K; rms_group 0 or a power of two in 32..1024 dividing K).
cudaError_t pq2_produce_int8_launch(const Pq2PrologueParams& q, const Pq2ProducerOut& out,
                                    int m, int k, bool pdl, cudaStream_t stream);

}  // namespace vllm_prism
