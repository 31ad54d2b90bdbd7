// Declarations of the CUDA ops that torch_bindings.cpp registers.
#pragma once

#include <optional>

#include <torch/all.h>

torch::Tensor pq2_dequantize(const torch::Tensor& raw, c10::ScalarType dtype);

torch::Tensor pq2_mma_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                           const torch::Tensor& xq, const torch::Tensor& sx,
                           const torch::Tensor& qsum, const std::optional<torch::Tensor>& bias,
                           c10::ScalarType out_dtype, int64_t split_k, bool pdl);

torch::Tensor pq2_gemv_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                            const torch::Tensor& xq, const torch::Tensor& sx,
                            const std::optional<torch::Tensor>& bias, c10::ScalarType out_dtype,
                            bool pdl);

// y [1, N] = W_st @ producer(x): the activation producer (prologue, signs, block Hadamard,
// int8) runs inside the GEMV launch (csrc/pq2/gemv_int8.cu); res_out gets x + residual.
torch::Tensor pq2_gemv_fused(const torch::Tensor& codes, const torch::Tensor& scales,
                             const torch::Tensor& x, const std::optional<torch::Tensor>& residual,
                             const std::optional<torch::Tensor>& res_out,
                             const std::optional<torch::Tensor>& rms_weight,
                             const std::optional<torch::Tensor>& gate,
                             const std::optional<torch::Tensor>& signs,
                             const std::optional<torch::Tensor>& bias, int64_t hadamard_block,
                             bool glu, double rms_offset, double eps, int64_t rms_group,
                             bool gate_sigmoid, c10::ScalarType out_dtype, bool pdl);

torch::Tensor pq2_mma_small_int8(const torch::Tensor& codes, const torch::Tensor& scales,
                                 const torch::Tensor& xq, const torch::Tensor& sx,
                                 const torch::Tensor& qsum,
                                 const std::optional<torch::Tensor>& bias,
                                 c10::ScalarType out_dtype, bool pdl, int64_t variant);

// Split-KV decode attention over vLLM's NHD int8_per_token_head cache
// (csrc/attention/int8_decode.cu): one query token per selected request; with num_segs > 1
// it writes the segments' partial outputs and log2-sum-exps for the merge kernel; pdl 1 / 2
// launches it with programmatic dependent launch, the next kernel let launch at its start / after
// its stage loop (the caller vouches that only the request's last slot was written by this step).
void int8_decode_attention(const torch::Tensor& q, const torch::Tensor& kv_cache,
                           const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                           const torch::Tensor& query_start_loc,
                           const std::optional<torch::Tensor>& req_ids, torch::Tensor& out,
                           torch::Tensor& part_o, torch::Tensor& part_lse, double scale,
                           int64_t num_segs, int64_t min_tiles, int64_t dim_split, int64_t pdl,
                           bool bulk);

// Split-KV verification attention over the int8_per_token_head cache
// (csrc/attention/int8_verify.cu): 1..max_q query tokens per selected request, prefix and
// causal tail in one pass; with num_segs > 1 it writes the partials for the merge kernel;
// int_qk runs Q.K on the int8 tensor cores with an int8 query (opt-in); dim_split 2 lets the
// two warps of a tile split S^T's head dimension where the kernel can (1: its columns);
// lazy_max keeps the running maxima across stages while the scores stay within bounds of them;
// pdl as for decode (only the request's query tokens' slots were written by this step).
void int8_verify_attention(const torch::Tensor& q, const torch::Tensor& kv_cache,
                           const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                           const torch::Tensor& query_start_loc,
                           const std::optional<torch::Tensor>& req_ids, torch::Tensor& out,
                           torch::Tensor& part_o, torch::Tensor& part_lse, double scale,
                           int64_t max_q, int64_t num_segs, int64_t min_tiles, bool int_qk,
                           int64_t dim_split, bool lazy_max, int64_t pdl);
// The same on Hopper's warpgroup MMA (csrc/attention/int8_verify_wgmma.cu; registered where the
// extension was built with sm_90 among its architectures, runs on compute capability 9.0):
// head sizes 128 and 256, exact Q.K; lazy_max as for int8_verify_attention; tma: the stage
// copies as TMA boxes of a tensor map over the cache (vLLM's NHD layout, else an error).
void int8_verify_wgmma_attention(const torch::Tensor& q, const torch::Tensor& kv_cache,
                                 const torch::Tensor& block_table, const torch::Tensor& seq_lens,
                                 const torch::Tensor& query_start_loc,
                                 const std::optional<torch::Tensor>& req_ids, torch::Tensor& out,
                                 torch::Tensor& part_o, torch::Tensor& part_lse, double scale,
                                 int64_t max_q, int64_t num_segs, int64_t min_tiles,
                                 bool lazy_max, int64_t pdl, bool tma);

// y [M, N] = W_st @ x for a bf16 / fp16 prefill activation (M >= 128) on Hopper's warpgroup
// MMA (csrc/pq2/wgmma_prefill.cu): x quantized to int8 per token and 128-group, then the
// fused GEMM; sm_90 only.
torch::Tensor pq2_wgmma_prefill(const torch::Tensor& codes, const torch::Tensor& scales,
                                const torch::Tensor& x, c10::ScalarType out_dtype);
// The same with the weight scales folded into int8 weights, promoted once a 1024-block
// (csrc/pq2/wgmma_fold.cuh): x quantized to int8 per token and 1024-block; a block's scales
// become D * q with |q| <= levels (63 for any codes, 127 for codes with no 3).
torch::Tensor pq2_wgmma_fold_prefill(const torch::Tensor& codes, const torch::Tensor& scales,
                                     const torch::Tensor& x, c10::ScalarType out_dtype,
                                     int64_t levels);
