// The torch ops around the PQ2 prefill GEMMs on Hopper's warpgroup MMA (wgmma_prefill.cu): checks,
// the tiled int8 activation's temporaries, the quantization and GEMM launches on the current
// stream; pq2_wgmma_fold_prefill runs the variant with the weight scales folded into the int8
// weights (wgmma_fold.cuh) at `levels` (Pq2WgmmaParams::fold_levels). They exist (and
// torch_bindings.cpp registers them) only where the extension was built with sm_90 in its
// architectures (PRISM_HAS_SM90A), so has_compiled_op tells the dispatch; it runs on compute
// capability 9.0 only.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "../ops.h"
#include "op_utils.h"
#include "wgmma_prefill_launch.h"

#ifdef PRISM_HAS_SM90A

using vllm_prism::aligned16;

namespace {

torch::Tensor wgmma_prefill(const char* op, bool fold, const torch::Tensor& codes,
                            const torch::Tensor& scales, const torch::Tensor& x,
                            c10::ScalarType out_dtype, int64_t fold_levels) {
  vllm_prism::check_weight_planes(op, codes, scales);
  TORCH_CHECK(codes.stride(0) == codes.size(1) && aligned16(codes), op,
              ": codes must be contiguous rows from a 16-byte aligned start");
  TORCH_CHECK((x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat16) &&
                  x.dim() == 2 && x.stride(1) == 1 && x.stride(0) % 8 == 0 && aligned16(x),
              op, ": x must be bf16 or fp16 [M, K] with 16-byte aligned rows");
  TORCH_CHECK(out_dtype == torch::kBFloat16 || out_dtype == torch::kFloat16, op,
              ": out_dtype must be bfloat16 or float16");
  TORCH_CHECK(fold_levels == 63 || fold_levels == 127, op, ": levels must be 63 (any codes) or ",
              "127 (codes with no 3), got ", fold_levels);
  TORCH_CHECK(x.device() == codes.device() && scales.device() == codes.device(), op,
              ": codes, scales and x must be on one device");
  const int64_t m = x.size(0), n = codes.size(0), k = codes.size(1) * 16;
  TORCH_CHECK(x.size(1) == k, op, ": x has K = ", x.size(1), ", codes have ", k);
  TORCH_CHECK(k % 128 == 0, op, ": K = ", k, " is not a multiple of 128");
  TORCH_CHECK(scales.size(1) >= k / 128, op, ": scales have ", scales.size(1),
              " groups, K needs ", k / 128);
  TORCH_CHECK(n < (int64_t{1} << 31) && m < (int64_t{1} << 24), op, ": too large");
  const c10::cuda::CUDAGuard guard(codes.device());
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(prop->major == 9 && prop->minor == 0, op,
              ": needs compute capability 9.0 (Hopper), this GPU is ", prop->major, ".",
              prop->minor);
  torch::Tensor out = torch::empty({m, n}, x.options().dtype(out_dtype));
  if (m == 0 || n == 0) return out;
  torch::Tensor xt =
      torch::empty({vllm_prism::pq2_wgmma_tiled_bytes(m, k)}, x.options().dtype(torch::kInt8));
  torch::Tensor sxt = torch::empty({fold ? vllm_prism::pq2_wgmma_fold_tiled_scales(m, k)
                                         : vllm_prism::pq2_wgmma_tiled_scales(m, k)},
                                   x.options().dtype(torch::kFloat32));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  cudaError_t err = (fold ? vllm_prism::pq2_wgmma_fold_quantize : vllm_prism::pq2_wgmma_quantize)(
      x.data_ptr(), x.scalar_type() == torch::kFloat16, x.stride(0), static_cast<int>(m),
      static_cast<int>(k), xt.data_ptr<int8_t>(), sxt.data_ptr<float>(), stream);
  TORCH_CHECK(err == cudaSuccess, op, ": quantization launch failed: ", cudaGetErrorString(err));
  vllm_prism::Pq2WgmmaParams p{};
  p.codes = codes.data_ptr<int32_t>();
  p.scales = reinterpret_cast<const uint16_t*>(scales.data_ptr());
  p.xt = xt.data_ptr<int8_t>();
  p.sxt = sxt.data_ptr<float>();
  p.out = out.data_ptr();
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.groups = static_cast<int>(k / 128);
  p.gpad = static_cast<int>(scales.stride(0));
  p.ldo = static_cast<int>(n);
  p.out_half = out_dtype == torch::kFloat16;
  p.fold_levels = static_cast<int>(fold_levels);
  err = fold ? vllm_prism::pq2_wgmma_fold_gemm(p, stream) : vllm_prism::pq2_wgmma_gemm(p, stream);
  TORCH_CHECK(err == cudaSuccess, op, ": GEMM launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

torch::Tensor pq2_wgmma_prefill(const torch::Tensor& codes, const torch::Tensor& scales,
                                const torch::Tensor& x, c10::ScalarType out_dtype) {
  return wgmma_prefill("pq2_wgmma_prefill", false, codes, scales, x, out_dtype, 63);
}

torch::Tensor pq2_wgmma_fold_prefill(const torch::Tensor& codes, const torch::Tensor& scales,
                                     const torch::Tensor& x, c10::ScalarType out_dtype,
                                     int64_t levels) {
  return wgmma_prefill("pq2_wgmma_fold_prefill", true, codes, scales, x, out_dtype, levels);
}

#endif  // PRISM_HAS_SM90A
