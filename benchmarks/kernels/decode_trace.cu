// Where the INT8 decode kernel's fixed cost goes, from inside it
// (csrc/attention/int8_decode.cu, one query token, split-KV): compiled here with
// PRISM_ATTN_TRACE so that thread 0 of each CTA writes its timeline (the extension's build has
// none of it). No torch, no vLLM.
//
// The call is bench_attention.py's decode (attn_trace_common.cuh: one request, 24 query / 4 KV
// heads, head size 256) with the op's segmentation (cuda_decode.num_cuda_segments: about 2 CTAs
// a multiprocessor, at most 256 segments), with each copy form: cp.async (the default) and one
// bulk copy a tile (VLLM_PRISM_ATTN_DECODE_COPY=bulk). Each (context, copy) is first checked
// (the partials, merged here, against a double-precision reference of two heads, relative
// error < 1e-2), then timed in a CUDA graph over cache copies that exceed three times the L2,
// then traced once on a cold copy.
//
// `us`: the kernel alone (the op adds the merge kernel, which bench_attention.py's decode rows
// include). From the timeline (the clock's cycles converted to us by its rate between the
// %globaltimer stamps): `start_spread_us` the CTAs' first entry to their last (the launch's ramp),
// `end_spread_us` the same for their ends (the tail), `span_us` the first entry to the last end;
// a CTA's `prologue_us` (entry to its first copies issued, after the grid-dependency wait),
// `first_wait_us` (those copies issued to the first stage in: a copy's latency with an idle
// pipeline), `wait_us` / `compute_us` a later stage's wait for its copies and its compute (the
// iteration's S^T, softmax and O^T), `end_us` (the loop's end to the output written), of it
// `merge_us` (to the warps' results in shared memory: the CTA's barriers and stores) and
// `write_us` (the merge over the tiles and the partials' stores); where a stage holds one tile
// (4 KV heads, this harness's shape) the kernel writes from registers, so `merge_us` is the
// lanes' row sums alone and `write_us` the stores.
// The CTAs' spread (attn_trace_common.cuh, read_tail; two traced launches): a CTA's stream is
// its first copies issued to its stage loop's end; `tail_us` its max less its mean, `sm_corr`
// whether the same multiprocessors are slow in both launches, `lone` / `shared` the CTAs alone
// on a multiprocessor against those that share one.
//
// Build and run on the GPU machine (scripts/gpu-session.sh attn-trace builds and runs both
// harnesses):
//   nvcc -O3 -std=c++17 --use_fast_math -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        benchmarks/kernels/decode_trace.cu -o trace
//   ./trace 4096,32768,131072 > trace.jsonl
//   ./trace 32768,131072 256,512,1024 > trace.jsonl    (segment counts other than the op's)
//   ./trace 32768,131072 "" fp32,fp16,bf16 > trace.jsonl    (the partials' dtypes,
//        cuda_decode.PARTIALS_DTYPE; "" keeps the op's segments; default fp32)
// Output: the device's line (its read bandwidth), then one JSON object per (context, segments,
// partials, copy).
// `trace --selftest` (no GPU) checks the timeline's reading on a made-up one.
#define PRISM_ATTN_TRACE 1
#include "attention/int8_decode.cu"
#include "attn_trace_common.cuh"

using namespace attn_trace_common;

namespace {

constexpr int kCtasPerSm = 2;  // cuda_decode.CTAS_PER_SM
using vllm_prism::kTraceIter;
using vllm_prism::kTraceMaxIters;
using vllm_prism::kTraceStride;

// What a launch's timeline says (us, but clock_mhz and iterations); `runs` its CTAs with work
// for the spread (read_tail): the multiprocessor (slot 6) and the copies issued to the loop's
// end.
struct Timeline {
  double span = 0, start_spread = 0, end_spread = 0, clock_mhz = 0, iterations = 0;
  double prologue = 0, first_wait = 0, first_wait_p90 = 0, wait = 0, wait_p90 = 0;
  double compute = 0, end = 0, merge = 0, write = 0, working = 0;
  std::vector<CtaRun> runs;
};

// Reads `tr` (ctas x kTraceStride words, the kernel's slots: int8_decode.cu). The CTAs' steps
// and spreads are those of the CTAs with work (the op launches a fixed number of segments, so a
// short context leaves the last ones none); the span is the whole launch's.
Timeline read_timeline(const std::vector<unsigned long long>& tr, int ctas) {
  uint64_t t_first, t_last;
  const double cyc_per_us = clock_per_us(tr, ctas, kTraceStride, 0, 4, 1, 5, t_first, t_last);
  auto us = [&](double c) { return c / cyc_per_us; };
  Timeline r;
  Stat prologue, first_wait, wait, compute, end, merge, write, iters;
  uint64_t last_start = 0, first_end = ~0ull;
  for (int b = 0; b < ctas; ++b) {
    const unsigned long long* t = tr.data() + static_cast<size_t>(b) * kTraceStride;
    if (t[0] == 0 || t[4] == 0 || t[kTraceIter] == 0) continue;  // not run, or no work
    last_start = std::max<uint64_t>(last_start, t[1]);
    first_end = std::min<uint64_t>(first_end, t[5]);
    prologue.add(us(t[2] - t[0]));
    int n = 0;
    for (int it = 0; it < kTraceMaxIters; ++it) {
      const unsigned long long* e = t + kTraceIter + 2 * it;
      if (e[0] == 0) break;
      ++n;
      const unsigned long long done = it + 1 < kTraceMaxIters && e[2] != 0 ? e[2] : t[3];
      if (it == 0) first_wait.add(us(e[1] - t[2]));
      else wait.add(us(e[1] - e[0]));
      compute.add(us(done - e[1]));
    }
    iters.add(n);
    end.add(us(t[4] - t[3]));
    merge.add(us(t[7] - t[3]));
    write.add(us(t[4] - t[7]));
    r.runs.push_back({static_cast<int>(t[6]), us(t[3] - t[2])});
  }
  r.span = (t_last - t_first) / 1e3;
  r.start_spread = (last_start - t_first) / 1e3;
  r.end_spread = (t_last - first_end) / 1e3;
  r.clock_mhz = cyc_per_us;
  r.iterations = iters.mean();
  r.prologue = prologue.mean();
  r.first_wait = first_wait.mean();
  r.first_wait_p90 = first_wait.pct(0.9);
  r.wait = wait.mean();
  r.wait_p90 = wait.pct(0.9);
  r.compute = compute.mean();
  r.end = end.mean();
  r.merge = merge.mean();
  r.write = write.mean();
  r.working = static_cast<double>(iters.v.size());
  return r;
}

// A timeline as one JSON object's fields.
std::string fields(const Timeline& r) {
  char buf[768];
  std::snprintf(
      buf, sizeof(buf),
      "\"span_us\": %.2f, \"start_spread_us\": %.2f, \"end_spread_us\": %.2f, "
      "\"clock_mhz\": %.0f, \"iterations\": %.1f, \"prologue_us\": %.3f, "
      "\"first_wait_us\": %.3f, \"first_wait_p90_us\": %.3f, \"wait_us\": %.3f, "
      "\"wait_p90_us\": %.3f, \"compute_us\": %.3f, \"end_us\": %.3f, \"merge_us\": %.3f, "
      "\"write_us\": %.3f, \"ctas_with_work\": %.0f",
      r.span, r.start_spread, r.end_spread, r.clock_mhz, r.iterations, r.prologue, r.first_wait,
      r.first_wait_p90, r.wait, r.wait_p90, r.compute, r.end, r.merge, r.write, r.working);
  return buf;
}

// --selftest (no GPU): a made-up timeline of 4 CTAs at 1,500 cycles a us, each entering 0.1 us
// after the one before: a 1 us prologue, a first stage in 2 us later, then 8 iterations of
// 1 us compute with 0.5 us waits from the second on, 1.5 us to the output (0.4 us of it to the
// warps' results in shared memory); and a fifth CTA
// without work (no iteration: left out of the steps, the spreads and the CTAs' runs); read
// back.
int selftest() {
  constexpr unsigned long long kUs = 1500;  // cycles a us
  const int ctas = 5;
  std::vector<unsigned long long> tr(static_cast<size_t>(ctas) * kTraceStride, 0);
  for (int b = 0; b < ctas - 1; ++b) {
    unsigned long long* t = tr.data() + static_cast<size_t>(b) * kTraceStride;
    t[0] = 9000000 + 11 * b;
    t[1] = 2000000 + 100 * b;  // ns
    t[2] = t[0] + kUs;
    unsigned long long at = t[2];
    for (int it = 0; it < 8; ++it) {
      unsigned long long* e = t + kTraceIter + 2 * it;
      e[0] = at;
      e[1] = at + (it == 0 ? 2 * kUs : kUs / 2);
      at = e[1] + kUs;
    }
    t[3] = at;
    t[4] = t[3] + kUs * 3 / 2;
    t[5] = t[1] + (t[4] - t[0]) * 1000 / kUs;  // 16 us later
    t[6] = 7 + b;  // the multiprocessor
    t[7] = t[3] + kUs * 2 / 5;
  }
  {  // no work: entered with the first, done 1.5 us later, 0.5 us of it writing its end
    unsigned long long* t = tr.data() + static_cast<size_t>(ctas - 1) * kTraceStride;
    t[0] = 9000000;
    t[1] = 2000000;
    t[2] = t[3] = t[0] + kUs;
    t[4] = t[3] + kUs / 2;
    t[5] = t[1] + 1500;
    t[6] = 3;
    t[7] = t[3] + kUs / 5;
  }
  const Timeline r = read_timeline(tr, ctas);
  // each CTA's stream: the 2 us first wait, 8 computes of 1 us and 7 waits of 0.5 us
  const std::vector<CtaRun>& runs = r.runs;
  std::vector<std::pair<double, double>> got = {
      {r.clock_mhz, 1500}, {r.iterations, 8}, {r.prologue, 1}, {r.first_wait, 2},
      {r.wait, 0.5}, {r.compute, 1}, {r.end, 1.5}, {r.merge, 0.4}, {r.write, 1.1},
      {r.start_spread, 0.3}, {r.end_spread, 0.3},
      {r.span, 16.3}, {static_cast<double>(runs.size()), 4}, {runs[3].stream_us, 13.5},
      {static_cast<double>(runs[3].sm), 10}, {r.working, 4}};
  for (const auto& pair : tail_selftest()) got.push_back(pair);
  for (const auto& pair : widen_selftest()) got.push_back(pair);
  return selftest_verdict(got, fields(r));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--selftest") == 0) return selftest();
  const std::vector<int> contexts = parse_ints(argc > 1 ? argv[1] : "4096,32768,131072");
  // the partials' dtypes (Int8AttnParams::part_dtype: 0 fp32, 1 fp16, 2 bf16)
  const std::map<std::string, int> dtype_codes = {{"fp32", 0}, {"fp16", 1}, {"bf16", 2}};
  const std::vector<std::string> partials = parse_names(argc > 3 ? argv[3] : "fp32");
  for (const std::string& part : partials) {
    if (!dtype_codes.count(part)) {
      std::fprintf(stderr, "partials: fp32, fp16 or bf16, not %s\n", part.c_str());
      return 2;
    }
  }
  SweepDevice dev;
  // the op's segment count, or the given ones (past 2 CTAs a multiprocessor: more waves, which
  // the block scheduler hands out as CTAs finish)
  const int op_segs = num_segments(dev.sms, 1, kCtasPerSm);
  const std::vector<int> seg_counts = argc > 2 && argv[2][0] != '\0'
                                          ? parse_ints(argv[2])
                                          : std::vector<int>{op_segs};
  const int max_segs = *std::max_element(seg_counts.begin(), seg_counts.end());
  const size_t max_words = static_cast<size_t>(max_segs) * kTraceStride;
  unsigned long long* trace = trace_buffer(max_words);
  const float qk_scale = static_cast<float>(1.0 / 16.0 * 1.4426950408889634);
  for (const int ctx : contexts) {
    const Cache cache(ctx, dev);
    for (const int segs : seg_counts) for (const std::string& part : partials) {
      Request req(ctx, 1, segs, cache, qk_scale);
      req.p.part_dtype = dtype_codes.at(part);
      const size_t words = static_cast<size_t>(segs) * kTraceStride;
      for (const int bulk : {0, 1}) {
        char what[128];
        std::snprintf(what, sizeof(what), "decode at context %d, %d segments, %s partials, %s "
                      "copies", ctx, segs, part.c_str(), bulk ? "bulk" : "cp_async");
        const Measured m = measure(cache, req, qk_scale, dev, trace, words, what, [&](int c) {
          vllm_prism::Int8AttnParams pc = req.p;
          pc.cache = cache.copies[c];
          pc.bulk = bulk;
          return vllm_prism::int8_decode_launch(pc, 1, dev.s);
        });
        const double gbps = cache.bytes / m.us / 1e3;
        const Timeline r = read_timeline(m.timelines[0], segs);
        const Tail tail = read_tail(r.runs, read_timeline(m.timelines[1], segs).runs);
        std::printf("{\"context\": %d, \"copy\": \"%s\", \"segments\": %d, "
                    "\"partials\": \"%s\", \"us\": %.2f, "
                    "\"gbps\": %.0f, \"frac\": %.3f, \"rel_err\": %.2e, %s, %s}\n",
                    ctx, bulk ? "bulk" : "cp_async", segs, part.c_str(), m.us, gbps,
                    gbps / dev.read_gbps,
                    m.err, fields(r).c_str(),
                    tail_fields(tail).c_str());
        std::fflush(stdout);
      }
    }
  }
  CHECK(cudaFree(trace));
  return 0;
}
