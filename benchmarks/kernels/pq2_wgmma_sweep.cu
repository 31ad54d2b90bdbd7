// The fused PQ2 prefill GEMMs on Hopper's warpgroup MMA (csrc/pq2/wgmma_prefill.cuh, the
// library's `wgmma_cuda`, and csrc/pq2/wgmma_fold.cuh, `wgmma_fold`), timed outside torch
// against cuBLAS's bf16 GEMM of the same shape in the same run (the prefill target: >= 1.0x
// bf16 F.linear at M >= 512, ../shared/perf/targets.md), with their quantization timed apart.
// Built and run by `bash scripts/wgmma-sweep.sh [SHAPES [MS]]` (nvcc sm_90a; with
// -DPQ2_WITH_CUBLAS and cuBLAS linked where found); results in
// benchmarks/results/pq2_wgmma_sweep_h200.md. (Its first, CTA-synchronous kernels, timed there,
// are in this file's history before the twenty-third session's commit.)
//
// The sweep's random int8 activation (pq2_sweep_common.cuh) is put into the GEMM's tiled layout
// by tile_activation; the fold kernel quantizes the same values (int8 times group scale, fp32)
// itself. The host reference checks sampled rows of every token against the formula of
// csrc/pq2/pq2_params.cuh in doubles (the exact product for the fold kernel), then again with
// every row's scales within +-12.5 % (both kernels' error). PQ2_SWEEP_CHECK_ONLY=1 skips the
// timings (for compute-sanitizer). Output lines are JSON.

#include <cuda_bf16.h>
#ifdef PQ2_WITH_CUBLAS
#include <cublas_v2.h>
#endif

#include "pq2/wgmma_fold.cuh"
#include "pq2_sweep_common.cuh"

using namespace pq2_sweep;
namespace wp = vllm_prism::wgmma_prefill;
using Gemm = cudaError_t (*)(const wp::Params&, cudaStream_t);

namespace {

// The sweep's int8 activation [M, K] and scales [M, G] in the tiled layout (the library's
// quantize_tiled writes it from bf16 directly): a thread a 16-byte chunk.
__global__ void tile_activation(const int8_t* x, const float* sx, int m, int k, int8_t* xt,
                                float* sxt) {
  const int groups = k / 128, m_pad = (m + 127) / 128 * 128;
  const int64_t chunks = int64_t(m_pad) * k / 16;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int tok = int(i / (k / 16)), kc = int(i % (k / 16)) * 16;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (tok < m) v = *reinterpret_cast<const uint4*>(x + int64_t(tok) * k + kc);
    *reinterpret_cast<uint4*>(xt + wp::tiled_offset(tok, kc, groups)) = v;
    if ((kc & 127) == 0)
      sxt[((int64_t(tok >> 7) * groups + kc / 128) << 7) + (tok & 127)] =
          tok < m ? sx[int64_t(tok) * groups + kc / 128] : 0.f;
  }
}

// The sweep's activation as fp32 values (int8 times its group scale): the fold kernel's
// quantization takes them as they are.
__global__ void dequant_activation(const int8_t* x, const float* sx, int m, int k, float* xf) {
  const int groups = k / 128;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < int64_t(m) * k;
       i += int64_t(gridDim.x) * blockDim.x)
    xf[i] = float(x[i]) * sx[(i / k) * groups + (i % k) / 128];
}

// fp16 scales a row within +-12.5 % of one value (the spread of a Hadamard block's groups),
// rows across 3 octaves.
__global__ void fill_narrow_scales(__half* p, int64_t n, int gpad, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2half(ldexpf(1.f + ((mix(i, seed) & 1023) / 1024.f - 0.5f) * 0.25f,
                               -9 + int(mix(i / gpad, seed + 1) % 3)));
}

// The sweep's activation tiled for ws (xt, and sxt large enough for the fold layout too) and
// the GEMM's parameters for copy 0 of the weights.
wp::Params tiled_input(const DeviceActivation& x, const WeightSlabs& w, int m, void* out,
                       const SweepDevice& dev) {
  int8_t* xt;
  float* sxt;
  CHECK(cudaMalloc(&xt, vllm_prism::pq2_wgmma_tiled_bytes(m, w.k)));
  CHECK(cudaMalloc(&sxt, 4 * std::max(vllm_prism::pq2_wgmma_tiled_scales(m, w.k),
                                      vllm_prism::pq2_wgmma_fold_tiled_scales(m, w.k))));
  tile_activation<<<4 * dev.sms, 256, 0, dev.s>>>(x.dx, x.dsx, m, w.k, xt, sxt);
  return wp::Params{w.codes(0), w.scales(0), xt, sxt, out, m, w.n, w.k, w.g128, w.gpad, w.n, 0};
}

__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16((int(mix(i, seed) % 2001) - 1000) * 1e-3f);
}

// Relative L2 error of out [m, n] (bf16) on `rows` against ref[i * mmax + t]; where it is
// above 1e-2 (a layout error), the first two rows' first tokens are printed for the pattern.
double check(const __nv_bfloat16* out, int m, int n, int mmax, const std::vector<int>& rows,
             const std::vector<double>& ref) {
  std::vector<__nv_bfloat16> hy(int64_t(m) * n);
  CHECK(cudaMemcpy(hy.data(), out, hy.size() * 2, cudaMemcpyDeviceToHost));
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int t = 0; t < m; ++t) {
      const double r = ref[i * mmax + t];
      const double v = __bfloat162float(hy[int64_t(t) * n + rows[i]]);
      err2 += (v - r) * (v - r);
      ref2 += r * r;
    }
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
  if (rel > 1e-2)
    for (int i = 0; i < 2; ++i) {
      std::printf("{\"row\": %d, \"ref_got\": [", rows[i]);
      for (int t = 0; t < std::min(m, 16); ++t)
        std::printf("%s[%.4g, %.4g]", t ? ", " : "", ref[i * mmax + t],
                    __bfloat162float(hy[int64_t(t) * n + rows[i]]));
      std::printf("]}\n");
    }
  return rel;
}

}  // namespace

int main(int argc, char** argv) {
  const auto shapes = parse_shapes(argc > 1 ? argv[1]
                                            : "12288x5120,34816x5120,5120x6144,5120x17408");
  const auto ms = parse_ints(argc > 2 ? argv[2] : "512,2048,4096");
  SweepDevice dev;
#ifdef PQ2_WITH_CUBLAS
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(blas, dev.s);
#endif
  const int mmax = *std::max_element(ms.begin(), ms.end());
  // PQ2_SWEEP_CHECK_ONLY=1: the checks without the timings (for compute-sanitizer)
  const bool check_only = std::getenv("PQ2_SWEEP_CHECK_ONLY") != nullptr;
  auto timed = [&](int calls, auto launch) {
    return check_only ? 1.0 : time_graph(calls, launch, dev.s);
  };
  for (const Shape& sh : shapes) {
    WeightSlabs w(sh.n, sh.k, dev.sms, dev.s);
    DeviceActivation x(mmax, sh.k, w.g128);
    __nv_bfloat16 *out, *wb, *xb, *yb;
    CHECK(cudaMalloc(&out, int64_t(mmax) * sh.n * 2));
    CHECK(cudaMalloc(&wb, int64_t(sh.n) * sh.k * 2));
    CHECK(cudaMalloc(&xb, int64_t(mmax) * sh.k * 2));
    CHECK(cudaMalloc(&yb, int64_t(mmax) * sh.n * 2));
    fill_bf16<<<4 * dev.sms, 256, 0, dev.s>>>(wb, int64_t(sh.n) * sh.k, 3);
    fill_bf16<<<4 * dev.sms, 256, 0, dev.s>>>(xb, int64_t(mmax) * sh.k, 5);
    float* xf;
    CHECK(cudaMalloc(&xf, int64_t(mmax) * sh.k * 4));
    dequant_activation<<<4 * dev.sms, 256, 0, dev.s>>>(x.dx, x.dsx, mmax, sh.k, xf);
    // rows to check: the first, the last and a spread between
    std::vector<int> rows;
    for (int i = 0; i < 24; ++i) rows.push_back(int(int64_t(i) * (sh.n - 1) / 23));
    double ref_max = 0;
    const auto ref = host_reference(w, x.hx, x.hsx, mmax, rows, ref_max);
    for (int m : ms) {
      double bf16_us = 0;
#ifdef PQ2_WITH_CUBLAS
      const float one = 1.f, zero = 0.f;
      bf16_us = timed(8, [&](int) {
        const cublasStatus_t st = cublasGemmEx(
            blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &one, wb, CUDA_R_16BF, sh.k, xb,
            CUDA_R_16BF, sh.k, &zero, yb, CUDA_R_16BF, sh.n, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT);
        return st == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
      });
#endif
      wp::Params a = tiled_input(x, w, m, out, dev);
      int8_t* xt = const_cast<int8_t*>(a.xt);
      float* sxt = const_cast<float*>(a.sxt);
      // a GEMM's error against ref, then its time over the weight copies
      auto check_and_time = [&](const wp::Params& a, Gemm gemm, double& rel) {
        CHECK(cudaMemsetAsync(out, 0xFF, int64_t(m) * sh.n * 2, dev.s));  // NaN: unwritten
        CHECK(gemm(a, dev.s));
        CHECK(cudaStreamSynchronize(dev.s));
        rel = check(out, m, sh.n, mmax, rows, ref);
        return timed(w.calls(), [&](int i) {
          wp::Params b = a;
          b.codes = w.codes(i % w.copies);
          b.scales = w.scales(i % w.copies);
          return gemm(b, dev.s);
        });
      };
      double rel = 0, frel = 0;
      const double us = check_and_time(a, wp::gemm, rel);
      const double q_us = timed(16, [&](int) {
        return wp::quantize_tiled(xb, sh.k, m, sh.k, xt, sxt, dev.s);
      });
      const double tops = 2.0 * m * sh.n * double(sh.k) / us / 1e6;
      std::printf("{\"shape\": \"%dx%d\", \"m\": %d, \"kernel\": \"pq2_wgmma_ws\", "
                  "\"us\": %.2f, \"quant_us\": %.2f, \"bf16_us\": %.2f, \"vs_bf16\": %.3f, "
                  "\"vs_bf16_with_quant\": %.3f, \"tops\": %.0f, \"rel_err\": %.3g}\n",
                  sh.n, sh.k, m, us, q_us, bf16_us, bf16_us > 0 ? bf16_us / us : 0.0,
                  bf16_us > 0 ? bf16_us / (us + q_us) : 0.0, tops, rel);
      std::fflush(stdout);
      CHECK(wp::quantize_fold(xf, sh.k, m, sh.k, xt, sxt, dev.s));
      const double fus = check_and_time(a, wp::fold_gemm, frel);
      const double fq_us = timed(16, [&](int) {
        return wp::quantize_fold(xb, sh.k, m, sh.k, xt, sxt, dev.s);
      });
      std::printf("{\"shape\": \"%dx%d\", \"m\": %d, \"kernel\": \"pq2_wgmma_fold\", "
                  "\"us\": %.2f, \"quant_us\": %.2f, \"bf16_us\": %.2f, \"vs_bf16\": %.3f, "
                  "\"vs_bf16_with_quant\": %.3f, \"vs_ws\": %.3f, \"tops\": %.0f, "
                  "\"rel_err\": %.3g, \"scales\": \"wide\"}\n",
                  sh.n, sh.k, m, fus, fq_us, bf16_us, bf16_us > 0 ? bf16_us / fus : 0.0,
                  bf16_us > 0 ? bf16_us / (fus + fq_us) : 0.0, us / fus,
                  2.0 * m * sh.n * double(sh.k) / fus / 1e6, frel);
      std::fflush(stdout);
      CHECK(cudaFree(xt));
      CHECK(cudaFree(sxt));
    }
    {  // both kernels' error where a row's scales lie within +-12.5 % (copy 0 rewritten)
      const int m = ms.front();
      fill_narrow_scales<<<4 * dev.sms, 256, 0, dev.s>>>(
          const_cast<__half*>(reinterpret_cast<const __half*>(w.scales(0))),
          int64_t(sh.n) * w.gpad, w.gpad, 21);
      CHECK(cudaStreamSynchronize(dev.s));
      double nmax = 0;
      const auto nref = host_reference(w, x.hx, x.hsx, m, rows, nmax);
      wp::Params a = tiled_input(x, w, m, out, dev);
      int8_t* xt = const_cast<int8_t*>(a.xt);
      float* sxt = const_cast<float*>(a.sxt);
      CHECK(wp::gemm(a, dev.s));
      CHECK(cudaStreamSynchronize(dev.s));
      const double wrel = check(out, m, sh.n, m, rows, nref);
      CHECK(wp::quantize_fold(xf, sh.k, m, sh.k, xt, sxt, dev.s));
      CHECK(wp::fold_gemm(a, dev.s));
      CHECK(cudaStreamSynchronize(dev.s));
      const double frel = check(out, m, sh.n, m, rows, nref);
      std::printf("{\"shape\": \"%dx%d\", \"m\": %d, \"scales\": \"narrow\", "
                  "\"ws_rel_err\": %.3g, \"fold_rel_err\": %.3g}\n", sh.n, sh.k, m, wrel, frel);
      std::fflush(stdout);
      CHECK(cudaFree(xt));
      CHECK(cudaFree(sxt));
    }
    CHECK(cudaFree(out));
    CHECK(cudaFree(wb));
    CHECK(cudaFree(xb));
    CHECK(cudaFree(yb));
    CHECK(cudaFree(xf));
  }
#ifdef PQ2_WITH_CUBLAS
  cublasDestroy(blas);
#endif
  return 0;
}
