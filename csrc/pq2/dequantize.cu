// PQ2_0 dequantization on the GPU: one thread per byte of 2-bit codes (four weights).
// A 34-byte block holds its fp16 scale d first, then 32 bytes of codes; element j of the
// block is code (qs[j/4] >> 2*(j%4)) & 3 and its value is (code - 1) * d.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../ops.h"

namespace {

constexpr int kBlockElems = 128;
constexpr int kBlockBytes = 34;
constexpr int kCodeBytes = 32;

template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) { return v; }
template <>
__device__ inline __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void pq2_dequantize_kernel(const uint8_t* __restrict__ raw, T* __restrict__ out,
                                      int64_t n_code_bytes) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_code_bytes) return;
  const int64_t blk = i / kCodeBytes;
  const int byte = static_cast<int>(i % kCodeBytes);
  const uint8_t* base = raw + blk * kBlockBytes;
  const float d = __half2float(*reinterpret_cast<const __half*>(base));
  const uint8_t q = base[2 + byte];
  T* dst = out + blk * kBlockElems + byte * 4;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    dst[k] = from_float<T>(static_cast<float>(((q >> (2 * k)) & 3) - 1) * d);
  }
}

}  // namespace

torch::Tensor pq2_dequantize(const torch::Tensor& raw, c10::ScalarType dtype) {
  TORCH_CHECK(raw.dtype() == torch::kUInt8, "pq2_dequantize: raw must be uint8");
  TORCH_CHECK(raw.dim() == 2 && raw.is_contiguous(), "pq2_dequantize: raw must be 2-D contiguous");
  TORCH_CHECK(raw.size(1) % kBlockBytes == 0,
              "pq2_dequantize: row bytes must be a multiple of 34 (PQ2_0 blocks)");
  const c10::cuda::CUDAGuard guard(raw.device());
  const int64_t rows = raw.size(0);
  const int64_t blocks_per_row = raw.size(1) / kBlockBytes;
  auto out = torch::empty({rows, blocks_per_row * kBlockElems}, raw.options().dtype(dtype));
  const int64_t n = rows * blocks_per_row * kCodeBytes;
  if (n == 0) return out;
  const int threads = 256;
  const int64_t grid = (n + threads - 1) / threads;
  auto stream = at::cuda::getCurrentCUDAStream();
  if (dtype == torch::kFloat32) {
    pq2_dequantize_kernel<float><<<grid, threads, 0, stream>>>(raw.data_ptr<uint8_t>(),
                                                               out.data_ptr<float>(), n);
  } else if (dtype == torch::kFloat16) {
    pq2_dequantize_kernel<__half><<<grid, threads, 0, stream>>>(
        raw.data_ptr<uint8_t>(), reinterpret_cast<__half*>(out.data_ptr<at::Half>()), n);
  } else if (dtype == torch::kBFloat16) {
    pq2_dequantize_kernel<__nv_bfloat16><<<grid, threads, 0, stream>>>(
        raw.data_ptr<uint8_t>(), reinterpret_cast<__nv_bfloat16*>(out.data_ptr<at::BFloat16>()), n);
  } else {
    TORCH_CHECK(false, "pq2_dequantize: dtype must be float32, float16 or bfloat16");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
