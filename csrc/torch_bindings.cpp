// Registers the vllm_prism._C custom ops with torch (namespace torch.ops._C_prism) and gives
// the shared library a Python module entry so that `import vllm_prism._C` loads it.
#include <Python.h>
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(_C_prism, m) {
  // Dequantize packed PQ2_0 rows (uint8 [rows, K/128*34]) to a dense [rows, K] tensor.
  m.def("pq2_dequantize(Tensor raw, ScalarType dtype) -> Tensor");
  m.impl("pq2_dequantize", c10::kCUDA, &pq2_dequantize);
  // y [M, N] = W_st @ x for an int8 activation on int8 tensor cores
  // (csrc/pq2/mma_int8.cu); split_k <= 0 chooses the K split.
  m.def(
      "pq2_mma_int8(Tensor codes, Tensor scales, Tensor xq, Tensor sx, Tensor qsum, "
      "Tensor? bias, ScalarType out_dtype, int split_k, bool pdl) -> Tensor");
  m.impl("pq2_mma_int8", c10::kCUDA, &pq2_mma_int8);
  // y [M, N] = W_st @ x for M = 1..4 int8 activation rows (csrc/pq2/gemv_int8.cu).
  m.def(
      "pq2_gemv_int8(Tensor codes, Tensor scales, Tensor xq, Tensor sx, Tensor? bias, "
      "ScalarType out_dtype, bool pdl) -> Tensor");
  m.impl("pq2_gemv_int8", c10::kCUDA, &pq2_gemv_int8);
  // y [1, N] = W_st @ producer(x) with the activation producer in the same launch
  // (csrc/pq2/gemv_int8.cu); res_out (with residual) receives x + residual.
  m.def(
      "pq2_gemv_fused(Tensor codes, Tensor scales, Tensor x, Tensor? residual, "
      "Tensor(a!)? res_out, Tensor? rms_weight, Tensor? gate, Tensor? signs, Tensor? bias, "
      "int hadamard_block, bool glu, float rms_offset, float eps, int rms_group, "
      "bool gate_sigmoid, ScalarType out_dtype, bool pdl) -> Tensor");
  m.impl("pq2_gemv_fused", c10::kCUDA, &pq2_gemv_fused);
  // y [M, N] = W_st @ x for 1..16 int8 activation rows, weights as the MMA's A operand
  // (csrc/pq2/mma_small.cu).
  m.def(
      "pq2_mma_small_int8(Tensor codes, Tensor scales, Tensor xq, Tensor sx, Tensor qsum, "
      "Tensor? bias, ScalarType out_dtype, bool pdl, int variant=0) -> Tensor");
  m.impl("pq2_mma_small_int8", c10::kCUDA, &pq2_mma_small_int8);
#ifdef PRISM_HAS_SM90A
  // y [M, N] = W_st @ x for a 16-bit prefill activation on Hopper's warpgroup MMA
  // (csrc/pq2/wgmma_prefill.cu; built where sm_90 is among the architectures).
  m.def("pq2_wgmma_prefill(Tensor codes, Tensor scales, Tensor x, ScalarType out_dtype) -> Tensor");
  m.impl("pq2_wgmma_prefill", c10::kCUDA, &pq2_wgmma_prefill);
  // ... with the weight scales folded into int8 weights (csrc/pq2/wgmma_fold.cuh)
  m.def(
      "pq2_wgmma_fold_prefill(Tensor codes, Tensor scales, Tensor x, ScalarType out_dtype, "
      "int levels) -> Tensor");
  m.impl("pq2_wgmma_fold_prefill", c10::kCUDA, &pq2_wgmma_fold_prefill);
#endif
  // Split-KV decode attention over the INT8 paged cache (csrc/attention/int8_decode.cu):
  // writes out (one segment) or the segments' partials for the merge kernel.
  m.def(
      "int8_decode_attention(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, "
      "Tensor query_start_loc, Tensor? req_ids, Tensor(a!) out, Tensor(b!) part_o, "
      "Tensor(c!) part_lse, float scale, int num_segs, int min_tiles, int dim_split=2, "
      "int pdl=0, bool bulk=False) -> ()");
  m.impl("int8_decode_attention", c10::kCUDA, &int8_decode_attention);
  // Split-KV verification attention over the INT8 paged cache (csrc/attention/int8_verify.cu).
  m.def(
      "int8_verify_attention(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, "
      "Tensor query_start_loc, Tensor? req_ids, Tensor(a!) out, Tensor(b!) part_o, "
      "Tensor(c!) part_lse, float scale, int max_q, int num_segs, int min_tiles, "
      "bool int_qk=False, int dim_split=2, bool lazy_max=False, int pdl=0) -> ()");
  m.impl("int8_verify_attention", c10::kCUDA, &int8_verify_attention);
#ifdef PRISM_HAS_SM90A
  // ... on Hopper's warpgroup MMA (csrc/attention/int8_verify_wgmma.cu), opt-in
  m.def(
      "int8_verify_wgmma_attention(Tensor q, Tensor kv_cache, Tensor block_table, "
      "Tensor seq_lens, Tensor query_start_loc, Tensor? req_ids, Tensor(a!) out, "
      "Tensor(b!) part_o, Tensor(c!) part_lse, float scale, int max_q, int num_segs, "
      "int min_tiles, bool lazy_max=False, int pdl=0, bool tma=False) -> ()");
  m.impl("int8_verify_wgmma_attention", c10::kCUDA, &int8_verify_wgmma_attention);
#endif
}

static struct PyModuleDef prism_module = {PyModuleDef_HEAD_INIT, "_C", nullptr, 0, nullptr};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&prism_module); }
