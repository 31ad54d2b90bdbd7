// The PQ2 activation producer's parameters in CUDA C++, torch-free: prologue -> signs -> block
// Hadamard -> int8 per 128-group, the operations and their order of the Triton producer
// (vllm_prism/kernels/pq2/hadamard.py), which the GEMV with the producer in its launch
// (gemv_int8.cu, M = 1) runs in each of its CTAs (producer_device.cuh).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace vllm_prism {

// What the producer computes before the signs, and where its inputs are (one row).
struct Pq2PrologueParams {
  const void* x;           // [K], or [2K] with glu (silu(x[:K]) * x[K:])
  const void* res;         // [K] added, or nullptr; the sum is written to res_out (by CTA 0)
  void* res_out;
  const void* rms_w;       // RMSNorm weight ([K], or [rms_group]), or nullptr: no norm
  const void* gate;        // [K]: times silu(gate) (sigmoid with gate_sigmoid), or nullptr
  const float* signs;      // [K], 16-byte aligned, or nullptr: no sign flip or Hadamard
  float rms_offset, eps, inv_sqrt_b;
  int x_dtype;             // 1 fp16, 2 bf16: x, res, res_out and gate
  int rms_dtype;           // 0 fp32, 1 fp16, 2 bf16
  int rms_group;           // 0: the norm over the whole row; else over each rms_group values
  int log_b;               // the Hadamard block is 2^log_b values (0: none)
  bool glu, gate_sigmoid;
  bool x_vec, res_vec, gate_vec;  // 16-byte aligned: 16-byte loads and stores
};

}  // namespace vllm_prism
