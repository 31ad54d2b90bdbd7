// Configuration sweep of the CUDA C++ PQ2 GEMV (csrc/pq2/gemv_int8.cu) outside torch.
//
// For each N x K shape and M (activation rows): every configuration compiled under
// PQ2_GEMV_ALL_CONFIGS (lanes per row, chunks per lane, load cache policy (M = 1 only),
// prefetch, warps per CTA, CTAs per multiprocessor),
// checked against a host reference of the formula in pq2_params.cuh (integer dots exact, fp32
// scaling: relative error below 1e-4), timed inside a CUDA graph of back-to-back launches
// over copies of the weights that together exceed three times the L2 (so every launch reads
// DRAM), with and without programmatic dependent launch. In the same run a streaming-read
// probe reads the same bytes per launch the same way: its time is the ceiling of one kernel
// reading that much at this size (launch, ramp and tail included), and the sustained read
// bandwidth comes from the probe on 2 GiB.
//
// Build and run on the GPU machine (scripts/gpu-session.sh gemv-sweep does both):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc benchmarks/kernels/pq2_gemv_sweep.cu -o sweep
//   ./sweep 12288x5120,34816x5120,5120x6144,5120x17408 1,2,4 > sweep.jsonl
// Output: one JSON object per line (shape, config, us, GB/s, fraction of the sustained
// bandwidth, of the same-size probe, error), then a summary line per shape.
// -DPQ2_GEMV_DEFAULT_ONLY: only the configurations the library chooses (a quick build, e.g.
// for Nsight Compute: ncu -k regex:pq2_gemv ./sweep 12288x5120 1).
#ifndef PQ2_GEMV_DEFAULT_ONLY
#define PQ2_GEMV_ALL_CONFIGS
#endif
#include "pq2/gemv_int8.cu"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using vllm_prism::GemvConfig;
using vllm_prism::Pq2LinearParams;

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,                 \
                   cudaGetErrorString(e_));                                          \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace {

constexpr int64_t kL2Bytes = 50LL << 20;

__device__ __forceinline__ uint32_t mix(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

__global__ void fill_words(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = mix(i, seed);
}

// fp16 scales in [2^-9, 2^-6)
__global__ void fill_scales(__half* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2half(ldexpf(1.f + (mix(i, seed) & 1023) / 1024.f, -9 + int(mix(i, seed + 1) % 3)));
}

// Streaming read of `bytes` (a multiple of 64) with 16-byte loads, four in flight per thread
// per iteration; the sum is stored only if it hits a value random data never gives.
__global__ void read_probe(const uint4* p, int64_t n16, unsigned* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = vllm_prism::load_codes<1>(
        reinterpret_cast<const int32_t*>(p + i + j * stride));
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

float half_to_float(uint16_t h) {
  __half x;
  std::memcpy(&x, &h, 2);
  return __half2float(x);
}

struct Shape {
  int n, k;
};

std::vector<Shape> parse_shapes(const char* s) {
  std::vector<Shape> out;
  std::string str(s);
  size_t pos = 0;
  while (pos < str.size()) {
    size_t end = str.find(',', pos);
    if (end == std::string::npos) end = str.size();
    const std::string item = str.substr(pos, end - pos);
    const size_t x = item.find('x');
    out.push_back({std::atoi(item.substr(0, x).c_str()), std::atoi(item.substr(x + 1).c_str())});
    pos = end + 1;
  }
  return out;
}

// Median of `reps` replays of a graph of `calls` launches made by `launch(i)`, us per launch.
template <typename F>
double time_graph(int calls, F launch, cudaStream_t s, int reps = 9) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) CHECK(launch(i));
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  for (int w = 0; w < 3; ++w) CHECK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return 1000.0 * ms[ms.size() / 2] / calls;
}

std::vector<int> parse_ints(const char* s) {
  std::vector<int> out;
  for (const char* q = s; *q;) {
    out.push_back(std::atoi(q));
    while (*q && *q != ',') ++q;
    if (*q == ',') ++q;
  }
  return out;
}

std::vector<GemvConfig> configs_for(int n, int k, int m) {
#ifdef PQ2_GEMV_DEFAULT_ONLY
  return {vllm_prism::pq2_gemv_default_config(n, k, m)};
#endif
  const int g64 = k / 64;
  const int lanes_cmax[][2] = {{8, 5}, {8, 10}, {16, 3}, {16, 5}, {16, 6},
                               {16, 9}, {32, 3}, {32, 5}, {32, 9}};
  std::vector<GemvConfig> out;
  for (auto& lc : lanes_cmax) {
    const int passes = (g64 + lc[0] * lc[1] - 1) / (lc[0] * lc[1]);
    // skip layouts where a lane's registers would mostly hold nothing
    if (passes == 1 && g64 * 2 < lc[0] * lc[1]) continue;
    if (passes > 3) continue;
    for (int hint = 0; hint < 3; ++hint)
      for (int pre = 0; pre < 2; ++pre)
        for (int warps : {4, 8})
          for (int cps : {0, 4, 8}) {
            if (hint != 1 && (m > 1 || warps != 8 || cps != 0)) continue;  // hints: M = 1
            if (m > 1 && cps == 4) continue;
            GemvConfig c;
            c.lanes = lc[0];
            c.cmax = lc[1];
            c.hint = hint;
            c.prefetch = pre;
            c.warps = warps;
            c.ctas_per_sm = cps;
            out.push_back(c);
          }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const char* shapes_arg = argc > 1 ? argv[1] : "12288x5120,34816x5120,5120x6144,5120x17408";
  const std::vector<int> ms = parse_ints(argc > 2 ? argv[2] : "1,2,4");
  int dev = 0, sms = 0;
  CHECK(cudaSetDevice(dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned* sink;
  CHECK(cudaMalloc(&sink, 4));

  // Sustained read bandwidth: the probe on 2 GiB.
  const int64_t big = 2LL << 30;
  uint4* bigbuf;
  CHECK(cudaMalloc(&bigbuf, big));
  fill_words<<<4 * sms, 256, 0, s>>>(reinterpret_cast<uint32_t*>(bigbuf), big / 4, 7);
  const double big_us = time_graph(
      4, [&](int) { read_probe<<<sms * 8, 512, 0, s>>>(bigbuf, big / 16, sink);
                    return cudaGetLastError(); }, s);
  CHECK(cudaFree(bigbuf));
  const double sustained = big / big_us / 1e3;  // GB/s
  std::printf("{\"gpu\": \"%s\", \"sms\": %d, \"read_gbps\": %.0f}\n", prop.name, sms, sustained);

  for (const Shape sh : parse_shapes(shapes_arg)) {
    const int n = sh.n, k = sh.k, g128 = (k + 127) / 128, gpad = (g128 + 7) / 8 * 8;
    const int64_t code_bytes = int64_t(n) * k / 4, scale_bytes = int64_t(n) * gpad * 2;
    const int64_t slab = (code_bytes + scale_bytes + 255) / 256 * 256;
    const int copies = static_cast<int>(std::min<int64_t>(64, std::max<int64_t>(
        2, (3 * kL2Bytes + slab - 1) / slab + 1)));
    const int mmax = *std::max_element(ms.begin(), ms.end());
    char* slabs;
    CHECK(cudaMalloc(&slabs, slab * copies));
    fill_words<<<4 * sms, 256, 0, s>>>(reinterpret_cast<uint32_t*>(slabs), slab * copies / 4, 11);
    for (int c = 0; c < copies; ++c)
      fill_scales<<<4 * sms, 256, 0, s>>>(reinterpret_cast<__half*>(slabs + c * slab + code_bytes),
                                           int64_t(n) * gpad, 13 + c);
    // activations: int8 [mmax, K], fp32 scales [mmax, G]
    std::vector<int8_t> hx(int64_t(mmax) * k);
    std::vector<float> hsx(int64_t(mmax) * g128);
    uint32_t r = 12345;
    for (auto& v : hx) { r = r * 1664525u + 1013904223u; v = int8_t(int(r >> 24) % 255 - 127); }
    for (auto& v : hsx) { r = r * 1664525u + 1013904223u; v = 0.001f + (r >> 8) * 1e-10f; }
    int8_t* dx;
    float *dsx, *dout;
    CHECK(cudaMalloc(&dx, hx.size()));
    CHECK(cudaMalloc(&dsx, 4 * hsx.size()));
    CHECK(cudaMalloc(&dout, 4 * int64_t(n) * mmax * copies));
    CHECK(cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dsx, hsx.data(), 4 * hsx.size(), cudaMemcpyHostToDevice));
    CHECK(cudaStreamSynchronize(s));

    // host reference of copy 0, every activation row
    std::vector<uint32_t> hc(code_bytes / 4);
    std::vector<uint16_t> hs(int64_t(n) * gpad);
    CHECK(cudaMemcpy(hc.data(), slabs, code_bytes, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hs.data(), slabs + code_bytes, scale_bytes, cudaMemcpyDeviceToHost));
    std::vector<double> ref(int64_t(n) * mmax);
    double ref_max = 0;
    std::vector<int8_t> val(k);
    for (int row = 0; row < n; ++row) {
      for (int idx = 0; idx < k; ++idx) {
        const int w = idx / 16, q = (idx % 16) / 4, b = idx % 4;
        val[idx] = int8_t(((hc[int64_t(row) * (k / 16) + w] >> (8 * b + 2 * q)) & 3) - 1);
      }
      for (int m = 0; m < mmax; ++m) {
        double y = 0;
        for (int g = 0; g < k / 128; ++g) {
          int64_t dot = 0;
          for (int e = g * 128; e < g * 128 + 128; ++e) dot += int64_t(val[e]) * hx[int64_t(m) * k + e];
          y += double(dot) * half_to_float(hs[int64_t(row) * gpad + g]) * hsx[int64_t(m) * g128 + g];
        }
        ref[int64_t(m) * n + row] = y;
        ref_max = std::max(ref_max, std::fabs(y));
      }
    }

    const int calls = copies * std::max(1, (64 + copies - 1) / copies);
    const double probe_us = time_graph(
        calls, [&](int i) {
          read_probe<<<sms * 8, 512, 0, s>>>(reinterpret_cast<const uint4*>(slabs + (i % copies) * slab),
                                             (code_bytes + scale_bytes) / 16, sink);
          return cudaGetLastError(); }, s);
    double m1_us = 0;
    for (const int m : ms) {
      auto params = [&](int c, bool pdl) {
        Pq2LinearParams p{};
        p.codes = reinterpret_cast<const int32_t*>(slabs + c * slab);
        p.scales = reinterpret_cast<const uint16_t*>(slabs + c * slab + code_bytes);
        p.xq = dx;
        p.sx = dsx;
        p.out = dout + int64_t(n) * mmax * c;
        p.out_dtype = 0;
        p.m = m;
        p.n = n;
        p.k = k;
        p.stride_c = k / 16;
        p.stride_s = gpad;
        p.stride_x = k;
        p.stride_g = g128;
        p.stride_o = n;
        p.split = 1;
        p.pdl = pdl;
        return p;
      };
      const double bytes = double(code_bytes) + double(n) * g128 * 2 + m * (k + 4.0 * g128);
      const GemvConfig dflt = vllm_prism::pq2_gemv_default_config(n, k, m);
      double best_us = 1e30, default_us = 0;
      std::string best;
      for (const GemvConfig& cfg : configs_for(n, k, m)) {
        CHECK(cudaMemsetAsync(dout, 0xff, 4 * int64_t(n) * m, s));
        CHECK(vllm_prism::pq2_gemv_int8_launch_config(params(0, false), cfg, sms, s));
        std::vector<float> out(int64_t(n) * m);
        CHECK(cudaMemcpyAsync(out.data(), dout, 4 * out.size(), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        double err = 0;
        for (size_t i = 0; i < out.size(); ++i)
          err = std::max(err, std::isfinite(out[i]) ? std::fabs(out[i] - ref[i]) / ref_max : 1e9);
        double us[2];
        for (int pdl = 0; pdl < 2; ++pdl)
          us[pdl] = time_graph(calls, [&](int i) {
            return vllm_prism::pq2_gemv_int8_launch_config(params(i % copies, pdl), cfg, sms, s); }, s);
        const bool is_default = cfg.lanes == dflt.lanes && cfg.cmax == dflt.cmax &&
                                cfg.hint == dflt.hint && cfg.prefetch == dflt.prefetch &&
                                cfg.warps == dflt.warps && cfg.ctas_per_sm == dflt.ctas_per_sm;
        if (is_default) default_us = us[0];
        char name[96];
        std::snprintf(name, sizeof name, "L%d C%d H%d P%d W%d S%d", cfg.lanes, cfg.cmax, cfg.hint,
                      int(cfg.prefetch), cfg.warps, cfg.ctas_per_sm);
        std::printf("{\"shape\": \"%dx%d\", \"M\": %d, \"config\": \"%s\", \"default\": %s, "
                    "\"us\": %.2f, \"us_pdl\": %.2f, \"gbps\": %.0f, \"bw_frac\": %.3f, "
                    "\"vs_probe\": %.3f, \"rel_err\": %.2e, \"ok\": %s}\n",
                    n, k, m, name, is_default ? "true" : "false", us[0], us[1],
                    bytes / us[0] / 1e3, bytes / us[0] / 1e3 / sustained, probe_us / us[0], err,
                    err < 1e-4 ? "true" : "false");
        if (err < 1e-4 && us[0] < best_us) { best_us = us[0]; best = name; }
      }
      if (m == 1) m1_us = default_us;
      std::printf("{\"shape\": \"%dx%d\", \"M\": %d, \"summary\": true, \"bytes\": %.0f, "
                  "\"copies\": %d, \"probe_us\": %.2f, \"probe_frac\": %.3f, \"best\": \"%s\", "
                  "\"best_us\": %.2f, \"best_frac\": %.3f, \"default_us\": %.2f, "
                  "\"default_frac\": %.3f, \"default_vs_probe\": %.3f, \"vs_m1\": %.3f}\n",
                  n, k, m, bytes, copies, probe_us, bytes / probe_us / 1e3 / sustained,
                  best.c_str(), best_us, bytes / best_us / 1e3 / sustained, default_us,
                  default_us > 0 ? bytes / default_us / 1e3 / sustained : 0.0,
                  default_us > 0 ? probe_us / default_us : 0.0,
                  m1_us > 0 ? default_us / m1_us : 0.0);
      std::fflush(stdout);
    }
    CHECK(cudaFree(slabs));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dsx));
    CHECK(cudaFree(dout));
  }
  return 0;
}
