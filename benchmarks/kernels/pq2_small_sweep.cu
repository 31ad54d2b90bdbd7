// Geometry sweep of the small-batch tensor-core PQ2 kernel mma_lean (csrc/pq2/mma_lean.cu,
// op variant 6 of pq2_mma_small_int8) against the library's other small-batch kernels and the
// GEMV, outside torch.
//
// For each N x K shape and M: every mma_lean configuration (K-split warps a tile, tiles a CTA,
// register cap, prefetch of the next unit), the automatic kernels' variants of today
// (mma_small_cuda: variant 0, mma_stream_cuda: 2 and 3) and, for M <= 4, the GEMV, each checked
// against a host reference of the formula in pq2_params.cuh on a sample of rows (relative
// error below 1e-4), then timed inside a CUDA graph of back-to-back launches over copies of
// the weights that together exceed three times the L2 (every launch reads DRAM), with and
// without programmatic dependent launch. A streaming-read probe of the same bytes gives the
// ceiling of one kernel reading that much; the probe on 2 GiB gives the sustained bandwidth.
//
// Build and run on the GPU machine (`bash scripts/gpu-session.sh small-sweep` does both):
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc benchmarks/kernels/pq2_small_sweep.cu \
//     csrc/pq2/mma_small.cu csrc/pq2/mma_bulk.cu csrc/pq2/mma_lean.cu csrc/pq2/gemv_int8.cu \
//     -o small-sweep
//   ./small-sweep 34816x5120,5120x17408 1,2,4,6,8 > small_sweep.jsonl
// Output: one JSON object per line (shape, M, kernel, config, us, us_pdl, fraction of the
// sustained bandwidth and of the probe, error), then a summary line per shape and M.
#include <functional>

#include "pq2/gemv_int8.cuh"
#include "pq2/mma_small.cuh"
#include "pq2_sweep_common.cuh"

using vllm_prism::LeanConfig;
using vllm_prism::Pq2LinearParams;
using namespace pq2_sweep;

namespace {

// A candidate: its name and how it launches on given parameters.
struct Candidate {
  std::string kernel, config;
  std::function<cudaError_t(const Pq2LinearParams&, cudaStream_t)> launch;
};

std::vector<Candidate> candidates(int n, int k, int m, int sms, bool lean_default_only) {
  std::vector<Candidate> out;
  if (m <= vllm_prism::kPq2GemvMaxM) {
    out.push_back({"gemv_cuda", "default", [sms](const Pq2LinearParams& p, cudaStream_t s) {
                     return vllm_prism::pq2_gemv_int8_launch(p, sms, s);
                   }});
  }
  const char* names[] = {"mma_small_cuda", "", "mma_stream_cuda", "mma_stream_cuda:3"};
  for (int v : {0, 2, 3}) {
    out.push_back({names[v], "variant " + std::to_string(v),
                   [sms, v](const Pq2LinearParams& p, cudaStream_t s) {
                     return vllm_prism::pq2_mma_small_launch(p, sms, s, v);
                   }});
  }
  if (m > vllm_prism::kPq2LeanMaxM || k % 512 != 0) return out;
  const int units = k / 512;
  std::vector<LeanConfig> cfgs;
  cfgs.push_back(vllm_prism::pq2_mma_lean_default_config(n, k, sms));
  if (!lean_default_only) {
    // 96 registers with the prefetch at K-slice counts 1..8 and at units / d, 1 and 2 tiles a
    // CTA; 128 registers with and without the prefetch at the default geometry
    std::vector<int> ks_set;
    for (int ks = 1; ks <= 8 && ks <= units; ++ks) ks_set.push_back(ks);
    for (int d : {1, 2, 3})
      for (int ks : {(units + d - 1) / d}) {
        if (ks <= 16 && std::find(ks_set.begin(), ks_set.end(), ks) == ks_set.end())
          ks_set.push_back(ks);
      }
    for (int ks : ks_set)
      for (int tiles : {1, 2}) {
        if (ks * tiles > 32) continue;
        LeanConfig c;
        c.ks = ks;
        c.tiles = tiles;
        c.regs = 96;
        c.prefetch = true;
        cfgs.push_back(c);
      }
    for (int pre : {0, 1}) {
      LeanConfig c = cfgs[0];
      c.regs = 128;
      c.prefetch = pre;
      cfgs.push_back(c);
    }
  }
  for (size_t i = 0; i < cfgs.size(); ++i) {
    const LeanConfig c = cfgs[i];
    char name[96];
    std::snprintf(name, sizeof name, "%sks%d t%d r%d p%d", i == 0 ? "default " : "", c.ks,
                  c.tiles, c.regs, int(c.prefetch));
    out.push_back({"mma_lean_cuda", name, [c](const Pq2LinearParams& p, cudaStream_t s) {
                     return vllm_prism::pq2_mma_lean_launch_config(p, c, s);
                   }});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const char* shapes_arg = argc > 1 ? argv[1] : "34816x5120,16384x5120,5120x17408,5120x6144";
  const std::vector<int> ms = parse_ints(argc > 2 ? argv[2] : "1,2,4,6,8");
  const bool lean_default_only = argc > 3 && std::string(argv[3]) == "default";
  const SweepDevice device;
  const int sms = device.sms;
  cudaStream_t s = device.s;
  unsigned* sink = device.sink;
  const double sustained = device.read_gbps;  // GB/s

  for (const Shape sh : parse_shapes(shapes_arg)) {
    const int n = sh.n, k = sh.k;
    const int mmax = *std::max_element(ms.begin(), ms.end());
    const WeightSlabs w(n, k, sms, s);
    const int g128 = w.g128, gpad = w.gpad, copies = w.copies;
    const int64_t code_bytes = w.code_bytes, scale_bytes = w.scale_bytes;
    const DeviceActivation act(mmax, k, g128);  // int8 [mmax, K], scales and sums [mmax, G]
    const std::vector<int8_t>& hx = act.hx;
    const std::vector<float>& hsx = act.hsx;
    int8_t* dx = act.dx;
    float* dsx = act.dsx;
    int32_t* dq = act.dq;
    float* dout;
    CHECK(cudaMalloc(&dout, 4 * int64_t(n) * mmax * copies));
    CHECK(cudaStreamSynchronize(s));

    // host reference of copy 0 on a sample of rows (every 7th, the last 40), every token
    std::vector<int> sample;
    for (int row = 0; row < n; ++row)
      if (row % 7 == 0 || row >= n - 40) sample.push_back(row);
    double ref_max = 0;
    const std::vector<double> ref = host_reference(w, hx, hsx, mmax, sample, ref_max);

    const int calls = w.calls();
    const double probe_us = time_graph(
        calls, [&](int i) {
          read_probe<<<sms * 8, 512, 0, s>>>(
              reinterpret_cast<const uint4*>(w.codes(i % copies)),
              (code_bytes + scale_bytes) / 16, sink);
          return cudaGetLastError(); }, s);
    for (const int m : ms) {
      auto params = [&](int c, bool pdl) {
        Pq2LinearParams p{};
        p.codes = w.codes(c);
        p.scales = w.scales(c);
        p.xq = dx;
        p.sx = dsx;
        p.qsum = dq;
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
      const double bytes = double(code_bytes) + double(n) * g128 * 2 + m * (k + 8.0 * g128);
      struct Best { double us = 1e30; std::string name; } best_lean, best_other;
      double lean_default_us = 0;
      for (const Candidate& cand : candidates(n, k, m, sms, lean_default_only)) {
        CHECK(cudaMemsetAsync(dout, 0xff, 4 * int64_t(n) * m, s));
        const cudaError_t err0 = cand.launch(params(0, false), s);
        if (err0 != cudaSuccess) {
          (void)cudaGetLastError();
          std::printf("{\"shape\": \"%dx%d\", \"M\": %d, \"kernel\": \"%s\", \"config\": \"%s\", "
                      "\"error\": \"%s\"}\n", n, k, m, cand.kernel.c_str(), cand.config.c_str(),
                      cudaGetErrorString(err0));
          continue;
        }
        std::vector<float> out(int64_t(n) * m);
        CHECK(cudaMemcpyAsync(out.data(), dout, 4 * out.size(), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        double err = 0;
        for (size_t si = 0; si < sample.size(); ++si)
          for (int mm = 0; mm < m; ++mm) {
            const float o = out[int64_t(mm) * n + sample[si]];
            err = std::max(err, std::isfinite(o) ? std::fabs(o - ref[si * mmax + mm]) / ref_max
                                                 : 1e9);
          }
        double us[2];
        for (int pdl = 0; pdl < 2; ++pdl)
          us[pdl] = time_graph(calls, [&](int i) {
            return cand.launch(params(i % copies, pdl), s); }, s);
        const bool ok = err < 1e-4;
        std::printf("{\"shape\": \"%dx%d\", \"M\": %d, \"kernel\": \"%s\", \"config\": \"%s\", "
                    "\"us\": %.2f, \"us_pdl\": %.2f, \"bw_frac\": %.3f, \"vs_probe\": %.3f, "
                    "\"rel_err\": %.2e, \"ok\": %s}\n",
                    n, k, m, cand.kernel.c_str(), cand.config.c_str(), us[0], us[1],
                    bytes / us[0] / 1e3 / sustained, probe_us / us[0], err, ok ? "true" : "false");
        std::fflush(stdout);
        if (!ok) continue;
        const double t = std::min(us[0], us[1]);
        Best& b = cand.kernel == "mma_lean_cuda" ? best_lean : best_other;
        if (t < b.us) { b.us = t; b.name = cand.kernel + " " + cand.config; }
        if (cand.config.rfind("default", 0) == 0) lean_default_us = t;
      }
      std::printf("{\"shape\": \"%dx%d\", \"M\": %d, \"summary\": true, \"bytes\": %.0f, "
                  "\"copies\": %d, \"probe_us\": %.2f, \"probe_frac\": %.3f, "
                  "\"best_other\": \"%s\", \"best_other_us\": %.2f, \"best_lean\": \"%s\", "
                  "\"best_lean_us\": %.2f, \"lean_default_us\": %.2f, \"lean_vs_other\": %.3f}\n",
                  n, k, m, bytes, copies, probe_us, bytes / probe_us / 1e3 / sustained,
                  best_other.name.c_str(), best_other.us, best_lean.name.c_str(), best_lean.us,
                  lean_default_us, best_other.us / best_lean.us);
      std::fflush(stdout);
    }
    CHECK(cudaFree(dout));
  }
  return 0;
}
