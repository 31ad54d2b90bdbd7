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

#include "pq2_sweep_common.cuh"

using vllm_prism::GemvConfig;
using vllm_prism::Pq2LinearParams;
using namespace pq2_sweep;

namespace {

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
    const DeviceActivation act(mmax, k, g128);
    const std::vector<int8_t>& hx = act.hx;
    const std::vector<float>& hsx = act.hsx;
    int8_t* dx = act.dx;
    float* dsx = act.dsx;
    float* dout;
    CHECK(cudaMalloc(&dout, 4 * int64_t(n) * mmax * copies));
    CHECK(cudaStreamSynchronize(s));

    // host reference of copy 0, every row and activation row
    std::vector<int> rows(n);
    for (int row = 0; row < n; ++row) rows[row] = row;
    double ref_max = 0;
    const std::vector<double> ref = host_reference(w, hx, hsx, mmax, rows, ref_max);

    const int calls = w.calls();
    const double probe_us = time_graph(
        calls, [&](int i) {
          read_probe<<<sms * 8, 512, 0, s>>>(
              reinterpret_cast<const uint4*>(w.codes(i % copies)),
              (code_bytes + scale_bytes) / 16, sink);
          return cudaGetLastError(); }, s);
    double m1_us = 0;
    for (const int m : ms) {
      auto params = [&](int c, bool pdl) {
        Pq2LinearParams p{};
        p.codes = w.codes(c);
        p.scales = w.scales(c);
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
        for (int mm = 0; mm < m; ++mm)
          for (int row = 0; row < n; ++row) {
            const float o = out[int64_t(mm) * n + row];
            err = std::max(err, std::isfinite(o) ? std::fabs(o - ref[int64_t(row) * mmax + mm]) /
                                                       ref_max
                                                 : 1e9);
          }
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
    CHECK(cudaFree(dout));
  }
  return 0;
}
