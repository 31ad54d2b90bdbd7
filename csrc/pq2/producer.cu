// The PQ2 activation producer on its own (see producer.cuh). Torch-free; the torch op is in
// producer_op.cu.
//
// One CTA per activation row, one thread per 32-value unit of it (producer_device.cuh): the
// row's prologue, signs and block Hadamard run in registers and lane shuffles, the whole-row
// RMSNorm takes one block reduction, and each 128-group's four lanes quantize it and write
// its codes, scale and code sum in the layout of ActKind.Q8 (kernels/pq2/hadamard.py).
#include "producer.cuh"

#include "producer_device.cuh"

namespace vllm_prism {
namespace {

constexpr int kMaxThreads = kPq2ProducerMaxK / 32;

__device__ __forceinline__ const void* row_of(const void* base, int64_t row, int64_t stride) {
  return base == nullptr ? nullptr : static_cast<const uint16_t*>(base) + row * stride;
}

__device__ __forceinline__ void* row_of(void* base, int64_t row, int64_t stride) {
  return base == nullptr ? nullptr : static_cast<uint16_t*>(base) + row * stride;
}

__global__ void __launch_bounds__(kMaxThreads, 1)
    pq2_produce_int8_kernel(const __grid_constant__ Pq2PrologueParams q,
                            const __grid_constant__ Pq2ProducerOut out, int k, bool pdl) {
  __shared__ float red[32];
  if (pdl) {  // let the linear's kernel launch, then wait for this one's inputs
    pdl_launch_dependents();
    pdl_wait();
  }
  const int64_t row = blockIdx.x;
  Pq2PrologueParams r = q;  // this row's tensors (16-bit elements)
  r.x = row_of(q.x, row, q.stride_x);
  r.res = row_of(q.res, row, q.stride_res);
  r.res_out = row_of(q.res_out, row, k);
  r.gate = row_of(q.gate, row, q.stride_gate);
  r.x_out = row_of(q.x_out, row, k);
  ProducedUnit pu;
  if (!produce_unit<true>(k, r, true, red, pu)) return;
  int sum = pu.sum + __shfl_xor_sync(kFull, pu.sum, 1);  // the 128-group: four lanes
  sum += __shfl_xor_sync(kFull, sum, 2);
  if (!pu.mine) return;
  const int u = threadIdx.x;
  int4* codes = reinterpret_cast<int4*>(out.xq + row * out.stride_xq + 32 * u);
  codes[0] = make_int4(pu.words[0], pu.words[1], pu.words[2], pu.words[3]);
  codes[1] = make_int4(pu.words[4], pu.words[5], pu.words[6], pu.words[7]);
  if ((u & 3) == 0) {
    out.sx[row * out.stride_g + (u >> 2)] = pu.amax / 127.f;
    out.qsum[row * out.stride_g + (u >> 2)] = sum;
  }
}

}  // namespace

cudaError_t pq2_produce_int8_launch(const Pq2PrologueParams& q, const Pq2ProducerOut& out,
                                    int m, int k, bool pdl, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (k % 128 != 0 || k > kPq2ProducerMaxK || q.log_b < 0 || q.log_b > 10 ||
      (q.log_b > 0 && (q.signs == nullptr || k % (1 << q.log_b) != 0)) ||
      (q.rms_group != 0 && (q.rms_group < 32 || q.rms_group > 1024 || k % q.rms_group))) {
    return cudaErrorInvalidValue;
  }
  if (reinterpret_cast<uintptr_t>(out.xq) % 16 || out.stride_xq % 16 ||
      reinterpret_cast<uintptr_t>(q.signs) % 16) {
    return cudaErrorMisalignedAddress;
  }
  const int threads = (k / 32 + 31) / 32 * 32;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(m), 1, 1);
  lc.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  lc.dynamicSmemBytes = 0;
  lc.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(lc, attr, pdl);
  return cudaLaunchKernelEx(&lc, pq2_produce_int8_kernel, q, out, k, pdl);
}

}  // namespace vllm_prism
