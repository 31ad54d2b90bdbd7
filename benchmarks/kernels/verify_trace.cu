// Where the INT8 verification kernel's time goes, from inside it: the warpgroup form with TMA
// boxes and lazy maxima (csrc/attention/int8_verify_wgmma.cu, the form vLLM serves on Hopper),
// compiled here with PRISM_ATTN_TRACE so that each CTA writes its timeline (the SM's clock at
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
// The CTAs' spread (attn_trace_common.cuh, read_tail; two traced launches): a CTA's stream is
// its longer consumer's loop and output; `tail_us` its max less its mean, `sm_corr` whether
// the same multiprocessors are slow in both launches.
//
// Build and run on the GPU machine (scripts/gpu-session.sh attn-trace builds and runs both
// harnesses):
//   nvcc -O3 -std=c++17 --use_fast_math -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        benchmarks/kernels/verify_trace.cu -o trace
//   ./trace 32768,131072 4,6,8 > trace.jsonl
//   ./trace 32768,131072 6 66,132,256 > trace.jsonl   (segments a KV head other than the op's)
// Output: the device's line (its read bandwidth), then one JSON object per (context, q tokens,
// producer). `trace --selftest` (no GPU) checks the timeline's reading on a made-up one.
#define PRISM_ATTN_TRACE 1
#include "attention/int8_verify_wgmma.cu"
#include "attn_trace_common.cuh"

using namespace attn_trace_common;

namespace {

constexpr int kCtasPerSm = 2;  // cuda_decode.VERIFY_CTAS_PER_SM
using vllm_prism::kTraceMaxStages;
using vllm_prism::kTraceProd;
using vllm_prism::kTraceStage;
using vllm_prism::kTraceSteps;
using vllm_prism::kTraceStride;

// What a launch's timeline says (us, but clock_mhz and the counts).
struct Timeline {
  double span = 0, clock_mhz = 0, wait = 0, wait_p90 = 0, s = 0, p = 0, o = 0, stage_p50 = 0;
  double loop = 0, loop_max = 0, pre = 0, post = 0, blocked = 0, arrival = 0, arrival_p90 = 0;
  double bound = 0;
  size_t stages = 0, waited = 0;
  std::vector<CtaRun> runs;  // for the spread (read_tail): slot 7, the longer consumer's stream
};

// Reads `tr` (ctas x kTraceStride words, the kernel's slots: int8_verify_wgmma.cu).
Timeline read_timeline(const std::vector<unsigned long long>& tr, int ctas) {
  uint64_t t_first, t_last;
  const double cyc_per_us = clock_per_us(tr, ctas, kTraceStride, 0, 4, 1, 6, t_first, t_last);
  auto us = [&](double c) { return c / cyc_per_us; };
  Timeline r;
  Stat wait, s_step, p_step, o_step, stage, loop, pre, post, blocked, arrival, bound;
  for (int b = 0; b < ctas; ++b) {
    const unsigned long long* t = tr.data() + static_cast<size_t>(b) * kTraceStride;
    if (t[0] == 0) continue;
    double cta_bound = 0, cta_stream = 0;
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
      cta_stream = std::max(cta_stream, us(t[4 + c] - t[2 + c]));
    }
    bound.add(cta_bound);
    r.runs.push_back({static_cast<int>(t[7]), cta_stream});
    for (int k = 0; k < 2 * kTraceMaxStages; ++k) {
      const unsigned long long a = t[kTraceProd + 2 * k], i = t[kTraceProd + 2 * k + 1];
      if (a != 0 && i >= a) blocked.add(us(i - a));
    }
  }
  r.span = (t_last - t_first) / 1e3;
  r.clock_mhz = cyc_per_us;
  r.stages = wait.v.size();
  r.wait = wait.mean();
  r.wait_p90 = wait.pct(0.9);
  r.s = s_step.mean();
  r.p = p_step.mean();
  r.o = o_step.mean();
  r.stage_p50 = stage.pct(0.5);
  r.loop = loop.mean();
  r.loop_max = loop.pct(1.0);
  r.pre = pre.mean();
  r.post = post.mean();
  r.blocked = blocked.mean();
  r.arrival = arrival.mean();
  r.arrival_p90 = arrival.pct(0.9);
  r.waited = arrival.v.size();
  r.bound = bound.pct(1.0);
  return r;
}

// A timeline as one JSON object's fields.
std::string fields(const Timeline& r) {
  char buf[1024];
  std::snprintf(
      buf, sizeof(buf),
      "\"traced_span_us\": %.2f, \"clock_mhz\": %.0f, \"stages\": %zu, \"wait_us\": %.3f, "
      "\"wait_p90_us\": %.3f, \"s_us\": %.3f, \"p_us\": %.3f, \"o_us\": %.3f, "
      "\"stage_p50_us\": %.3f, \"loop_us\": %.2f, \"loop_max_us\": %.2f, \"pre_us\": %.2f, "
      "\"post_us\": %.2f, \"prod_blocked_us\": %.3f, \"arrival_us\": %.3f, "
      "\"arrival_p90_us\": %.3f, \"waited_stages\": %zu, \"compute_bound_us\": %.2f",
      r.span, r.clock_mhz, r.stages, r.wait, r.wait_p90, r.s, r.p, r.o, r.stage_p50, r.loop,
      r.loop_max, r.pre, r.post, r.blocked, r.arrival, r.arrival_p90, r.waited, r.bound);
  return buf;
}

// --selftest (no GPU): a made-up timeline of 2 CTAs at 1,500 cycles a us, each consumer 8 stages
// of a 1 us wait, 0.5 / 1 / 0.5 us steps, 2 us before its loop and 1 us after, each copy issued
// 0.5 us after the producer's wait began and 2 us before its consumer saw it; read back.
int selftest() {
  constexpr unsigned long long kUs = 1500;  // cycles a us
  const int ctas = 2;
  std::vector<unsigned long long> tr(static_cast<size_t>(ctas) * kTraceStride, 0);
  for (int b = 0; b < ctas; ++b) {
    unsigned long long* t = tr.data() + static_cast<size_t>(b) * kTraceStride;
    const unsigned long long t0 = 5000000 + 7 * b;
    t[0] = t0;
    t[1] = 1000000 + 100 * b;  // ns
    for (int c = 0; c < 2; ++c) {
      t[2 + c] = t0 + 2 * kUs;
      unsigned long long at = t[2 + c];
      for (int j = 0; j < 8; ++j) {
        unsigned long long* e = t + kTraceStage + (c * kTraceMaxStages + j) * kTraceSteps;
        e[0] = at;
        e[1] = at + kUs;
        e[2] = e[1] + kUs / 2;
        e[3] = e[2] + kUs;
        e[4] = e[3] + kUs / 2;
        at = e[4];
        const int k = 2 * j + c;
        t[kTraceProd + 2 * k + 1] = e[1] - 2 * kUs;
        t[kTraceProd + 2 * k] = t[kTraceProd + 2 * k + 1] - kUs / 2;
      }
      t[4 + c] = at + kUs;
    }
    t[6] = t[1] + (t[4] - t[0]) * 1000 / kUs;  // 27 us later
    t[7] = 3 + b;  // the multiprocessor
  }
  const Timeline r = read_timeline(tr, ctas);
  // each CTA's stream: a consumer's 8 stages of 3 us and its 1 us output
  const std::vector<CtaRun>& runs = r.runs;
  std::vector<std::pair<double, double>> got = {
      {r.clock_mhz, 1500}, {r.wait, 1}, {r.s, 0.5}, {r.p, 1}, {r.o, 0.5}, {r.stage_p50, 2},
      {r.loop, 24}, {r.loop_max, 24}, {r.pre, 2}, {r.post, 1}, {r.blocked, 0.5},
      {r.arrival, 2}, {r.bound, 19}, {r.span, 27.1}, {static_cast<double>(r.stages), 32},
      {static_cast<double>(r.waited), 32}, {static_cast<double>(runs.size()), 2},
      {runs[1].stream_us, 25}, {static_cast<double>(runs[1].sm), 4}};
  for (const auto& pair : tail_selftest()) got.push_back(pair);
  return selftest_verdict(got, fields(r));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--selftest") == 0) return selftest();
  const std::vector<int> contexts = parse_ints(argc > 1 ? argv[1] : "32768,131072");
  const std::vector<int> q_tokens = parse_ints(argc > 2 ? argv[2] : "4,6,8");
  SweepDevice dev;
  // segments a KV head: the op's (one wave of CTAs), or the given ones (more: more waves)
  const std::vector<int> seg_counts =
      argc > 3 ? parse_ints(argv[3])
               : std::vector<int>{num_segments(dev.sms, kKvHeads, kCtasPerSm)};
  const int max_segs = *std::max_element(seg_counts.begin(), seg_counts.end());
  unsigned long long* trace =
      trace_buffer(static_cast<size_t>(kKvHeads * ((max_segs + 1) / 2)) * kTraceStride);
  const float qk_scale = static_cast<float>(1.0 / 16.0 * 1.4426950408889634);
  for (const int ctx : contexts) {
    const Cache cache(ctx, dev);
    for (const int segs : seg_counts) {
      const int ctas = kKvHeads * ((segs + 1) / 2);
      const size_t words = static_cast<size_t>(ctas) * kTraceStride;
      for (const int nq : q_tokens) {
        const Request req(ctx, nq, segs, cache, qk_scale);
        // the producer: TMA boxes over the cache's tensor map (the default), or cp.async
        for (const bool tma : {true, false}) {
          char what[128];
          std::snprintf(what, sizeof(what),
                        "verification at context %d, %d query tokens, %d segments, %s", ctx, nq,
                        segs, tma ? "tma" : "cp_async");
          const Measured m = measure(cache, req, qk_scale, dev, trace, words, what, [&](int c) {
            vllm_prism::Int8AttnParams pc = req.p;
            pc.cache = cache.copies[c];
            return vllm_prism::int8_verify_wgmma_launch(pc, tma ? cache.n_blocks : 0, 1, dev.s);
          });
          const double gbps = cache.bytes / m.us / 1e3;
          const Timeline r = read_timeline(m.timelines[0], ctas);
          const Tail tail = read_tail(r.runs, read_timeline(m.timelines[1], ctas).runs);
          std::printf("{\"context\": %d, \"q_tokens\": %d, \"producer\": \"%s\", "
                      "\"segments\": %d, \"ctas\": %d, \"us\": %.2f, \"gbps\": %.0f, "
                      "\"frac\": %.3f, \"rel_err\": %.2e, %s, %s}\n",
                      ctx, nq, tma ? "tma" : "cp_async", segs, ctas, m.us, gbps,
                      gbps / dev.read_gbps, m.err,
                      fields(r).c_str(),
                      tail_fields(tail).c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  CHECK(cudaFree(trace));
  return 0;
}
