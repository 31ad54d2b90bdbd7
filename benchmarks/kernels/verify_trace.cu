// Where the INT8 verification kernel's time goes, from inside it: the warpgroup form with TMA
// boxes and lazy maxima (csrc/attention/int8_verify_wgmma.cu, the form vLLM serves on Hopper),
// compiled here with PRISM_VERIFY_TRACE so that each CTA writes its timeline (the SM's clock at
// each consumer step of each stage, the producer's waits and copy issues; the extension's build
// has none of it). No torch, no vLLM.
//
// The call is bench_attention.py's: one request of `context` tokens whose last q are the query
// tokens, 24 query / 4 KV heads, head size 256, vLLM's int8_per_token_head NHD cache (blocks of
// 16 slots in a random order, random codes, scales in [2^-8, 2^-6)), the op's segmentation
// (cuda_decode.num_cuda_segments: about 2 CTAs of segments a multiprocessor, so 66 segments a
// KV head on 132 SMs, a CTA two of them), with each producer: TMA boxes (the default) and
// cp.async. Each (context, q, producer) is first checked: the partials, merged here, against a
// double-precision reference of two columns (relative error < 1e-2), then timed in a CUDA graph
// over cache copies that exceed three times the L2, then traced once on a cold copy.
//
// Per consumer stage (the cycles converted to us by the clock's rate between %globaltimer
// stamps): `wait` for the stage's copies, `s` its S^T (K fragments and the MMAs), `p` scores,
// softmax and P^T up to the barrier that publishes it, `o` V^T and the O^T MMAs; `loop_us` a
// consumer's loop, `pre_us` the CTA's start to its loop (Q^T), `post_us` the output. The
// producer: `prod_blocked_us` its wait for a free buffer and the lag rule a stage, `arrival_us`
// a copy's issue to its consumer seeing it, over the stages its consumer was waiting for
// (the copy's own latency under the call's load). `compute_bound_us`: the longest consumer's
// loop without its waits, plus pre and post: the kernel if the copies were free.
//
// Build and run on the GPU machine (scripts/gpu-session.sh verify-trace does both):
//   nvcc -O3 -std=c++17 --use_fast_math -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        benchmarks/kernels/verify_trace.cu -o trace
//   ./trace 32768,131072 4,6,8 > trace.jsonl
// Output: the device's line (its read bandwidth), then one JSON object per (context, q tokens,
// producer).
#define PRISM_VERIFY_TRACE 1
#include "attention/int8_verify_wgmma.cu"
#include "pq2_sweep_common.cuh"

#include <cuda_bf16.h>

using namespace pq2_sweep;

namespace {

constexpr int kHD = 256;
constexpr int kKvHeads = 4;
constexpr int kGroup = 6;
constexpr int kQHeads = kKvHeads * kGroup;
constexpr int kBlock = 16;
constexpr int kRowBytes = 2 * kHD + 8;  // [K int8 | K scale f32 | V int8 | V scale f32]
constexpr int kSlotBytes = kKvHeads * kRowBytes;
constexpr int kBlockBytes = kBlock * kSlotBytes;
constexpr int kMinTiles = 4;  // cuda_decode.MIN_TILES
constexpr int kCtasPerSm = 2;  // cuda_decode.VERIFY_CTAS_PER_SM
constexpr int kMaxSegments = 256;  // cuda_decode.MAX_SEGMENTS
using vllm_prism::kTraceMaxStages;
using vllm_prism::kTraceProd;
using vllm_prism::kTraceStage;
using vllm_prism::kTraceSteps;
using vllm_prism::kTraceStride;

// every row's two scales: positive, in [2^-8, 2^-6)
__global__ void fix_scales(uint8_t* cache, int64_t rows, uint32_t seed) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    uint8_t* row = cache + r * kRowBytes;
    const float ks = ldexpf(1.f + (mix(r, seed) & 1023) / 1024.f, -8 + int(mix(r, seed + 1) % 2));
    const float vs = ldexpf(1.f + (mix(r, seed + 2) & 1023) / 1024.f, -8 + int(mix(r, seed + 3) % 2));
    memcpy(row + kHD, &ks, 4);
    memcpy(row + 2 * kHD + 4, &vs, 4);
  }
}

// segments a KV head, as cuda_decode.num_cuda_segments / geometry.split_count
int num_segments(int sms) {
  const int want = (sms * kCtasPerSm + kKvHeads - 1) / kKvHeads;
  return std::max(1, std::min(kMaxSegments, want));
}

// The double-precision attention of query token tq, head hq over the cache (host copy `c`,
// blocks in `table`): positions 0 .. prefix + tq.
std::vector<double> reference(const std::vector<uint8_t>& c, const std::vector<int32_t>& table,
                              const std::vector<__nv_bfloat16>& q, int prefix, int tq, int hq,
                              float qk_scale) {
  const int kvh = hq / kGroup;
  const int n = prefix + tq + 1;
  std::vector<double> s(n);
  double mx = -1e300;
  auto row = [&](int pos) {
    return c.data() + static_cast<int64_t>(table[pos / kBlock]) * kBlockBytes +
           (pos % kBlock) * kSlotBytes + kvh * kRowBytes;
  };
  const __nv_bfloat16* qh = q.data() + (static_cast<int64_t>(tq) * kQHeads + hq) * kHD;
  for (int pos = 0; pos < n; ++pos) {
    const uint8_t* r = row(pos);
    float ks;
    memcpy(&ks, r + kHD, 4);
    double dot = 0;
    for (int d = 0; d < kHD; ++d)
      dot += static_cast<double>(static_cast<int8_t>(r[d])) * __bfloat162float(qh[d]);
    s[pos] = dot * ks * qk_scale;  // log2 units
    mx = std::max(mx, s[pos]);
  }
  std::vector<double> o(kHD, 0.0);
  double l = 0;
  for (int pos = 0; pos < n; ++pos) {
    const uint8_t* r = row(pos);
    float vs;
    memcpy(&vs, r + 2 * kHD + 4, 4);
    const double w = std::exp2(s[pos] - mx);
    l += w;
    for (int d = 0; d < kHD; ++d)
      o[d] += w * static_cast<int8_t>(r[kHD + 4 + d]) * vs;
  }
  for (double& v : o) v /= l;
  return o;
}

// The merged output of (tq, hq) from the partials (log2-sum-exp weights; -inf: empty).
std::vector<double> merged(const std::vector<float>& po, const std::vector<float>& pl, int segs,
                           int tq, int hq) {
  const int64_t base = (static_cast<int64_t>(tq) * kQHeads + hq) * segs;
  double m = -1e300;
  for (int s = 0; s < segs; ++s)
    if (std::isfinite(pl[base + s])) m = std::max(m, static_cast<double>(pl[base + s]));
  std::vector<double> o(kHD, 0.0);
  double wsum = 0;
  for (int s = 0; s < segs; ++s) {
    if (!std::isfinite(pl[base + s])) continue;
    const double w = std::exp2(pl[base + s] - m);
    wsum += w;
    for (int d = 0; d < kHD; ++d) o[d] += w * po[(base + s) * kHD + d];
  }
  for (double& v : o) v /= wsum;
  return o;
}

struct Stat {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  double mean() const {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / v.size();
  }
  double pct(double f) const {
    if (v.empty()) return 0;
    std::vector<double> w = v;
    std::sort(w.begin(), w.end());
    return w[std::min(w.size() - 1, static_cast<size_t>(f * w.size()))];
  }
};

// The cache of one context: `copies` copies (together past three times the L2), the block
// table, and copy 0 on the host for the reference.
struct Cache {
  int n_blocks = 0;
  int64_t bytes = 0;
  std::vector<int8_t*> copies;
  std::vector<int32_t> table;
  int32_t* d_table = nullptr;
  std::vector<uint8_t> host0;

  Cache(int ctx, const SweepDevice& dev) {
    n_blocks = (ctx + kBlock - 1) / kBlock;
    bytes = static_cast<int64_t>(n_blocks) * kBlockBytes;
    copies.resize(static_cast<size_t>(std::max<int64_t>(2, 3 * kL2Bytes / bytes + 1)));
    for (size_t c = 0; c < copies.size(); ++c) {
      CHECK(cudaMalloc(&copies[c], bytes));
      fill_words<<<4 * dev.sms, 256, 0, dev.s>>>(reinterpret_cast<uint32_t*>(copies[c]),
                                                 bytes / 4, 23 + c);
      fix_scales<<<4 * dev.sms, 256, 0, dev.s>>>(reinterpret_cast<uint8_t*>(copies[c]),
                                                 bytes / kRowBytes, 101 + c);
    }
    table = shuffled_blocks(n_blocks);
    CHECK(cudaMalloc(&d_table, n_blocks * 4));
    CHECK(cudaMemcpy(d_table, table.data(), n_blocks * 4, cudaMemcpyHostToDevice));
    // the fills ran on the harness's non-blocking stream, the copies on the legacy one
    CHECK(cudaDeviceSynchronize());
    host0.resize(bytes);
    CHECK(cudaMemcpy(host0.data(), copies[0], bytes, cudaMemcpyDeviceToHost));
  }
  ~Cache() {
    CHECK(cudaFree(d_table));
    for (int8_t* c : copies) CHECK(cudaFree(c));
  }
};

// One request of `ctx` tokens whose last nq are the query: its query, partials and the
// kernel's parameters (the op's: fill_int8_attn_params with lazy maxima, no PDL).
struct Request {
  int ctx, nq, segs;
  size_t n_part;
  std::vector<__nv_bfloat16> q;
  __nv_bfloat16 *d_q = nullptr, *d_out = nullptr;
  int32_t* d_meta = nullptr;
  float *d_po = nullptr, *d_pl = nullptr;
  vllm_prism::Int8AttnParams p{};

  Request(int ctx_, int nq_, int segs_, const Cache& cache, float qk_scale)
      : ctx(ctx_), nq(nq_), segs(segs_), n_part(static_cast<size_t>(nq_) * kQHeads * segs_) {
    q.resize(static_cast<size_t>(nq) * kQHeads * kHD);
    XorShift r{0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(ctx * 131 + nq)};
    for (auto& x : q)
      x = __float2bfloat16(static_cast<float>((r.next() >> 11) % 4001) / 1000.f - 2.f);
    CHECK(cudaMalloc(&d_q, q.size() * 2));
    CHECK(cudaMalloc(&d_out, q.size() * 2));
    CHECK(cudaMemcpy(d_q, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    const int32_t meta[3] = {ctx, 0, nq};  // seq_lens[0], query_start_loc[0..1]
    CHECK(cudaMalloc(&d_meta, sizeof(meta)));
    CHECK(cudaMemcpy(d_meta, meta, sizeof(meta), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&d_po, n_part * kHD * 4));
    CHECK(cudaMalloc(&d_pl, n_part * 4));
    p.q = d_q;
    p.stride_qt = kQHeads * kHD;
    p.stride_qh = kHD;
    p.q_dtype = 2;
    p.stride_cb = kBlockBytes;
    p.stride_ch = kRowBytes;
    p.stride_cn = kSlotBytes;
    p.block_table = cache.d_table;
    p.stride_bt = cache.n_blocks;
    p.seq_lens = d_meta;
    p.qsl = d_meta + 1;
    p.out = d_out;
    p.stride_ot = kQHeads * kHD;
    p.stride_oh = kHD;
    p.out_dtype = 2;
    p.part_o = d_po;
    p.part_lse = d_pl;
    p.stride_pr = static_cast<int64_t>(n_part) * kHD;
    p.stride_pt = static_cast<int64_t>(kQHeads) * segs * kHD;
    p.stride_ph = static_cast<int64_t>(segs) * kHD;
    p.stride_ps = kHD;
    p.stride_lr = static_cast<int64_t>(n_part);
    p.stride_lt = static_cast<int64_t>(kQHeads) * segs;
    p.stride_lh = segs;
    p.qk_scale = qk_scale;
    p.group = kGroup;
    p.num_kv_heads = kKvHeads;
    p.head_dim = kHD;
    p.max_q = nq;
    p.block_size = kBlock;
    p.num_segs = segs;
    p.min_tiles = kMinTiles;
    p.dim_split = 1;
    p.lazy_max = 1;
    CHECK(cudaDeviceSynchronize());  // the copies are in before the stream's launches
  }
  ~Request() {
    CHECK(cudaFree(d_q));
    CHECK(cudaFree(d_out));
    CHECK(cudaFree(d_meta));
    CHECK(cudaFree(d_po));
    CHECK(cudaFree(d_pl));
  }

  // The largest relative L2 error of two columns' merged partials (the first token's first
  // head, the last token's last head) against the double-precision reference.
  double error(const Cache& cache, float qk_scale) const {
    std::vector<float> po(n_part * kHD), pl(n_part);
    CHECK(cudaMemcpy(po.data(), d_po, po.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(pl.data(), d_pl, pl.size() * 4, cudaMemcpyDeviceToHost));
    double err = 0;
    const int cols[2][2] = {{0, 0}, {nq - 1, kQHeads - 1}};
    for (const auto& col : cols) {
      const std::vector<double> want =
          reference(cache.host0, cache.table, q, ctx - nq, col[0], col[1], qk_scale);
      const std::vector<double> got = merged(po, pl, segs, col[0], col[1]);
      double num = 0, den = 0;
      for (int d = 0; d < kHD; ++d) {
        num += (got[d] - want[d]) * (got[d] - want[d]);
        den += want[d] * want[d];
      }
      err = std::max(err, std::sqrt(num / den));
    }
    return err;
  }
};

// What a launch's timeline (`tr`, ctas x kTraceStride words) says, as one JSON object's fields.
std::string timeline_fields(const std::vector<unsigned long long>& tr, int ctas) {
  // the clock's rate: cycles per ns between the %globaltimer stamps, over the CTAs
  double cyc = 0, ns = 0;
  uint64_t t_first = ~0ull, t_last = 0;
  for (int b = 0; b < ctas; ++b) {
    const unsigned long long* t = tr.data() + static_cast<size_t>(b) * kTraceStride;
    if (t[6] <= t[1] || t[4] <= t[0]) continue;
    cyc += static_cast<double>(t[4] - t[0]);
    ns += static_cast<double>(t[6] - t[1]);
    t_first = std::min<uint64_t>(t_first, t[1]);
    t_last = std::max<uint64_t>(t_last, t[6]);
  }
  const double cyc_per_us = ns > 0 ? 1e3 * cyc / ns : 1.0;
  auto us = [&](double c) { return c / cyc_per_us; };
  Stat wait, s_step, p_step, o_step, stage, loop, pre, post, blocked, arrival, bound;
  for (int b = 0; b < ctas; ++b) {
    const unsigned long long* t = tr.data() + static_cast<size_t>(b) * kTraceStride;
    if (t[0] == 0) continue;
    double cta_bound = 0;
    for (int c = 0; c < 2; ++c) {
      if (t[2 + c] == 0 || t[4 + c] == 0) continue;
      double busy = 0;
      unsigned long long last = t[2 + c];
      for (int j = 0; j < kTraceMaxStages; ++j) {
        const unsigned long long* e = t + kTraceStage + (c * kTraceMaxStages + j) * kTraceSteps;
        if (e[0] == 0 || e[4] == 0) continue;  // not run, or past the segment's end
        wait.add(us(e[1] - e[0]));
        s_step.add(us(e[2] - e[1]));
        p_step.add(us(e[3] - e[2]));
        o_step.add(us(e[4] - e[3]));
        stage.add(us(e[4] - e[1]));
        busy += static_cast<double>(e[4] - e[1]);
        last = e[4];
        // the copy's latency where its consumer was waiting for it (200 cycles: a wait that
        // found the stage in)
        const unsigned long long issue = t[kTraceProd + 2 * (2 * j + c) + 1];
        if (issue != 0 && e[1] - e[0] > 200 && e[1] > issue) arrival.add(us(e[1] - issue));
      }
      loop.add(us(last - t[2 + c]));
      pre.add(us(t[2 + c] - t[0]));
      post.add(us(t[4 + c] - last));
      cta_bound = std::max(cta_bound, us(t[2 + c] - t[0] + busy + (t[4 + c] - last)));
    }
    bound.add(cta_bound);
    for (int k = 0; k < 2 * kTraceMaxStages; ++k) {
      const unsigned long long a = t[kTraceProd + 2 * k], i = t[kTraceProd + 2 * k + 1];
      if (a != 0 && i >= a) blocked.add(us(i - a));
    }
  }
  char buf[1024];
  std::snprintf(
      buf, sizeof(buf),
      "\"traced_span_us\": %.2f, \"clock_mhz\": %.0f, \"stages\": %zu, \"wait_us\": %.3f, "
      "\"wait_p90_us\": %.3f, \"s_us\": %.3f, \"p_us\": %.3f, \"o_us\": %.3f, "
      "\"stage_p50_us\": %.3f, \"loop_us\": %.2f, \"loop_max_us\": %.2f, \"pre_us\": %.2f, "
      "\"post_us\": %.2f, \"prod_blocked_us\": %.3f, \"arrival_us\": %.3f, "
      "\"arrival_p90_us\": %.3f, \"waited_stages\": %zu, \"compute_bound_us\": %.2f",
      (t_last - t_first) / 1e3, cyc_per_us, wait.v.size(), wait.mean(), wait.pct(0.9),
      s_step.mean(), p_step.mean(), o_step.mean(), stage.pct(0.5), loop.mean(), loop.pct(1.0),
      pre.mean(), post.mean(), blocked.mean(), arrival.mean(), arrival.pct(0.9),
      arrival.v.size(), bound.pct(1.0));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int> contexts = parse_ints(argc > 1 ? argv[1] : "32768,131072");
  const std::vector<int> q_tokens = parse_ints(argc > 2 ? argv[2] : "4,6,8");
  SweepDevice dev;
  const int segs = num_segments(dev.sms);
  const int ctas = kKvHeads * ((segs + 1) / 2);
  const size_t words = static_cast<size_t>(ctas) * kTraceStride;
  unsigned long long* trace;
  CHECK(cudaMalloc(&trace, words * 8));
  CHECK(cudaMemcpyToSymbol(vllm_prism::g_verify_trace, &trace, sizeof(trace)));
  const float qk_scale = static_cast<float>(1.0 / 16.0 * 1.4426950408889634);
  for (const int ctx : contexts) {
    const Cache cache(ctx, dev);
    const int copies = static_cast<int>(cache.copies.size());
    for (const int nq : q_tokens) {
      const Request req(ctx, nq, segs, cache, qk_scale);
      // the producer: TMA boxes over the cache's tensor map (the default), or cp.async
      for (const bool tma : {true, false}) {
        auto launch = [&](int c) {
          vllm_prism::Int8AttnParams pc = req.p;
          pc.cache = cache.copies[c];
          return vllm_prism::int8_verify_wgmma_launch(pc, tma ? cache.n_blocks : 0, 1, dev.s);
        };
        CHECK(launch(0));
        CHECK(cudaStreamSynchronize(dev.s));
        const double err = req.error(cache, qk_scale);
        if (!(err < 1e-2)) {
          std::fprintf(stderr, "context %d, %d query tokens, %s: relative error %.3g against "
                       "the reference\n", ctx, nq, tma ? "tma" : "cp_async", err);
          return 1;
        }
        const double us =
            time_graph(2 * copies, [&](int i) { return launch(i % copies); }, dev.s);
        // the timeline of a cold copy (another one read last)
        CHECK(launch(1));
        CHECK(cudaMemsetAsync(trace, 0, words * 8, dev.s));
        CHECK(launch(0));
        CHECK(cudaStreamSynchronize(dev.s));
        std::vector<unsigned long long> tr(words);
        CHECK(cudaMemcpy(tr.data(), trace, words * 8, cudaMemcpyDeviceToHost));
        const double gbps = cache.bytes / us / 1e3;
        std::printf("{\"context\": %d, \"q_tokens\": %d, \"producer\": \"%s\", "
                    "\"segments\": %d, \"ctas\": %d, \"us\": %.2f, \"gbps\": %.0f, "
                    "\"frac\": %.3f, \"rel_err\": %.2e, %s}\n",
                    ctx, nq, tma ? "tma" : "cp_async", segs, ctas, us, gbps,
                    gbps / dev.read_gbps, err, timeline_fields(tr, ctas).c_str());
        std::fflush(stdout);
      }
    }
  }
  CHECK(cudaFree(trace));
  return 0;
}
