// The fused PQ2 prefill GEMM on Hopper's warpgroup MMA (csrc/pq2/wgmma_prefill.cuh, the
// library's `wgmma_cuda`), timed outside torch against cuBLAS's bf16 GEMM of the same shape in
// the same run (the prefill target: >= 1.0x bf16 F.linear at M >= 512,
// ../shared/perf/targets.md), with its quantization pass timed apart. Built and run by
// `bash scripts/wgmma-sweep.sh [SHAPES [MS]]` (nvcc sm_90a; with -DPQ2_WITH_CUBLAS and cuBLAS
// linked where found); results in benchmarks/results/pq2_wgmma_sweep_h200.md. (Its first,
// CTA-synchronous kernels, timed there, are in this file's history before the twenty-third
// session's commit.)
//
// The sweep's random int8 activation (pq2_sweep_common.cuh) is put into the GEMM's tiled layout
// by tile_activation; the host reference checks sampled rows of every token against the
// formula of csrc/pq2/pq2_params.cuh in doubles. Output lines are JSON.

#include <cuda_bf16.h>
#ifdef PQ2_WITH_CUBLAS
#include <cublas_v2.h>
#endif

#include "pq2/wgmma_prefill.cuh"
#include "pq2_sweep_common.cuh"

using namespace pq2_sweep;
namespace wp = vllm_prism::wgmma_prefill;

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
    // rows to check: the first, the last and a spread between
    std::vector<int> rows;
    for (int i = 0; i < 24; ++i) rows.push_back(int(int64_t(i) * (sh.n - 1) / 23));
    double ref_max = 0;
    const auto ref = host_reference(w, x.hx, x.hsx, mmax, rows, ref_max);
    for (int m : ms) {
      double bf16_us = 0;
#ifdef PQ2_WITH_CUBLAS
      const float one = 1.f, zero = 0.f;
      bf16_us = time_graph(8, [&](int) {
        const cublasStatus_t st = cublasGemmEx(
            blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &one, wb, CUDA_R_16BF, sh.k, xb,
            CUDA_R_16BF, sh.k, &zero, yb, CUDA_R_16BF, sh.n, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT);
        return st == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
      }, dev.s);
#endif
      int8_t* xt;
      float* sxt;
      CHECK(cudaMalloc(&xt, vllm_prism::pq2_wgmma_tiled_bytes(m, sh.k)));
      CHECK(cudaMalloc(&sxt, 4 * vllm_prism::pq2_wgmma_tiled_scales(m, sh.k)));
      tile_activation<<<4 * dev.sms, 256, 0, dev.s>>>(x.dx, x.dsx, m, sh.k, xt, sxt);
      wp::Params a{w.codes(0), w.scales(0), xt, sxt, out, m, sh.n, sh.k, w.g128, w.gpad, sh.n,
                   0};
      CHECK(cudaMemsetAsync(out, 0xFF, int64_t(m) * sh.n * 2, dev.s));  // NaN: unwritten shows
      CHECK(wp::gemm(a, dev.s));
      CHECK(cudaStreamSynchronize(dev.s));
      const double rel = check(out, m, sh.n, mmax, rows, ref);
      const double us = time_graph(w.calls(), [&](int i) {
        wp::Params b = a;
        b.codes = w.codes(i % w.copies);
        b.scales = w.scales(i % w.copies);
        return wp::gemm(b, dev.s);
      }, dev.s);
      const double q_us = time_graph(16, [&](int) {
        return wp::quantize_tiled(xb, sh.k, m, sh.k, xt, sxt, dev.s);
      }, dev.s);
      const double tops = 2.0 * m * sh.n * double(sh.k) / us / 1e6;
      std::printf("{\"shape\": \"%dx%d\", \"m\": %d, \"kernel\": \"pq2_wgmma_ws\", "
                  "\"us\": %.2f, \"quant_us\": %.2f, \"bf16_us\": %.2f, \"vs_bf16\": %.3f, "
                  "\"vs_bf16_with_quant\": %.3f, \"tops\": %.0f, \"rel_err\": %.3g}\n",
                  sh.n, sh.k, m, us, q_us, bf16_us, bf16_us > 0 ? bf16_us / us : 0.0,
                  bf16_us > 0 ? bf16_us / (us + q_us) : 0.0, tops, rel);
      std::fflush(stdout);
      CHECK(cudaFree(xt));
      CHECK(cudaFree(sxt));
    }
    CHECK(cudaFree(out));
    CHECK(cudaFree(wb));
    CHECK(cudaFree(xb));
    CHECK(cudaFree(yb));
  }
#ifdef PQ2_WITH_CUBLAS
  cublasDestroy(blas);
#endif
  return 0;
}
