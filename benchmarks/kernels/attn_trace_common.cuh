// What the INT8 attention kernels' timeline harnesses share (verify_trace.cu, decode_trace.cu;
// no torch): bench_attention.py's call (one request, 24 query / 4 KV heads, head size 256,
// vLLM's int8_per_token_head NHD cache in blocks of 16 slots in a random order, random codes,
// scales in [2^-8, 2^-6)), in cache copies that together exceed three times the L2; the
// request's query, partials and parameters; the double-precision reference of a column and the
// partials' merge that a harness checks a launch with; and the timeline's helpers (the clock's
// rate from the %globaltimer stamps, means and percentiles, the CTAs' spread over two launches
// by the multiprocessors they ran on).
#pragma once

#include <cuda_bf16.h>

#include <map>
#include <string>
#include <utility>

#include "attention/int8_attention.cuh"
#include "pq2_sweep_common.cuh"

namespace attn_trace_common {

using namespace pq2_sweep;

constexpr int kHD = 256;
constexpr int kKvHeads = 4;
constexpr int kGroup = 6;
constexpr int kQHeads = kKvHeads * kGroup;
constexpr int kBlock = 16;
constexpr int kRowBytes = 2 * kHD + 8;  // [K int8 | K scale f32 | V int8 | V scale f32]
constexpr int kSlotBytes = kKvHeads * kRowBytes;
constexpr int kBlockBytes = kBlock * kSlotBytes;
constexpr int kMinTiles = 4;  // cuda_decode.MIN_TILES
constexpr int kMaxSegments = 256;  // cuda_decode.MAX_SEGMENTS

// every row's two scales: positive, in [2^-8, 2^-6)
__global__ void fix_scales(uint8_t* cache, int64_t rows, uint32_t seed) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    uint8_t* row = cache + r * kRowBytes;
    const float ks =
        ldexpf(1.f + (mix(r, seed) & 1023) / 1024.f, -8 + int(mix(r, seed + 1) % 2));
    const float vs =
        ldexpf(1.f + (mix(r, seed + 2) & 1023) / 1024.f, -8 + int(mix(r, seed + 3) % 2));
    memcpy(row + kHD, &ks, 4);
    memcpy(row + 2 * kHD + 4, &vs, 4);
  }
}

// segments a group (a request, or a (request, KV head)) for `groups` groups at `per_sm`
// CTAs a multiprocessor: cuda_decode.num_cuda_segments / geometry.split_count
inline int num_segments(int sms, int groups, int per_sm) {
  const int want = (sms * per_sm + groups - 1) / groups;
  return std::max(1, std::min(kMaxSegments, want));
}

// The double-precision attention of query token tq, head hq over the cache (host copy `c`,
// blocks in `table`): positions 0 .. prefix + tq.
inline std::vector<double> reference(const std::vector<uint8_t>& c,
                                     const std::vector<int32_t>& table,
                                     const std::vector<__nv_bfloat16>& q, int prefix, int tq,
                                     int hq, float qk_scale) {
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
inline std::vector<double> merged(const std::vector<float>& po, const std::vector<float>& pl,
                                  int segs, int tq, int hq) {
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

// A timeline's values of one kind: their mean and percentiles.
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

// Partials the kernel wrote as fp16 (dtype 1) or bf16 (2) into the first half of `po`'s bytes,
// widened in place to fp32 (backwards: element i's 4 bytes start at or past half i's 2); fp32
// (0) is left as it is.
inline void widen_partials(std::vector<float>& po, int dtype) {
  if (dtype == 0) return;
  const uint16_t* h = reinterpret_cast<const uint16_t*>(po.data());
  for (size_t i = po.size(); i-- > 0;) {
    const uint16_t bits = h[i];
    if (dtype == 1) {
      __half_raw raw;
      raw.x = bits;
      po[i] = __half2float(__half(raw));
    } else {
      const uint32_t f = static_cast<uint32_t>(bits) << 16;
      std::memcpy(&po[i], &f, 4);
    }
  }
}

// widen_partials on values both half types hold exactly: (read, expected) pairs for
// selftest_verdict
inline std::vector<std::pair<double, double>> widen_selftest() {
  const float vals[5] = {1.5f, -0.375f, 256.f, 0.f, -2.f};
  std::vector<std::pair<double, double>> out;
  for (int dtype = 1; dtype <= 2; ++dtype) {
    std::vector<float> po(5, 0.f);
    uint16_t* h = reinterpret_cast<uint16_t*>(po.data());
    for (int i = 0; i < 5; ++i) {
      if (dtype == 1) {
        h[i] = __half_raw(__float2half(vals[i])).x;
      } else {
        uint32_t f;
        std::memcpy(&f, &vals[i], 4);
        h[i] = static_cast<uint16_t>(f >> 16);
      }
    }
    widen_partials(po, dtype);
    for (int i = 0; i < 5; ++i) out.emplace_back(po[i], vals[i]);
  }
  return out;
}

// One request of `ctx` tokens whose last nq are the query: its query, partials and the
// kernels' parameters as the op fills them (fill_int8_attn_params; no PDL, one warp a tile,
// lazy maxima, cp.async tiles: each harness sets its own).
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
    widen_partials(po, p.part_dtype);
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

// The timelines' buffer, `words` 64-bit words, where the kernel writes them.
inline unsigned long long* trace_buffer(size_t words) {
  static_assert(vllm_prism::attn_trace::kOn, "include the kernel with PRISM_ATTN_TRACE 1");
  unsigned long long* buf;
  CHECK(cudaMalloc(&buf, words * 8));
  CHECK(cudaMemcpyToSymbol(vllm_prism::attn_trace::g_buf, &buf, sizeof(buf)));
  return buf;
}

// One launch form of a request (`launch(c)`: on cache copy c): its error against the reference,
// its time in a CUDA graph over the copies (us a launch) and the timelines of two launches on a
// cold copy (every other copy read since), for the CTAs' spread over two launches (read_tail).
// Exits the harness where the error is 1e-2 or more.
struct Measured {
  double err = 0, us = 0;
  std::vector<unsigned long long> timelines[2];
};
template <class Launch>
Measured measure(const Cache& cache, const Request& req, float qk_scale, const SweepDevice& dev,
                 unsigned long long* trace, size_t words, const char* what, Launch&& launch) {
  Measured m;
  CHECK(launch(0));
  CHECK(cudaStreamSynchronize(dev.s));
  m.err = req.error(cache, qk_scale);
  if (!(m.err < 1e-2)) {
    std::fprintf(stderr, "%s: relative error %.3g against the reference\n", what, m.err);
    std::exit(1);
  }
  const int copies = static_cast<int>(cache.copies.size());
  m.us = time_graph(2 * copies, [&](int i) { return launch(i % copies); }, dev.s);
  for (std::vector<unsigned long long>& timeline : m.timelines) {
    for (int c = 1; c < copies; ++c) CHECK(launch(c));
    CHECK(cudaMemsetAsync(trace, 0, words * 8, dev.s));
    CHECK(launch(0));
    CHECK(cudaStreamSynchronize(dev.s));
    timeline.resize(words);
    CHECK(cudaMemcpy(timeline.data(), trace, words * 8, cudaMemcpyDeviceToHost));
  }
  return m;
}

// One CTA of a traced launch, for the CTAs' spread: the multiprocessor it ran on and its stream
// (us; what each harness's read_timeline says it is, in its Timeline's runs).
struct CtaRun {
  int sm = 0;
  double stream_us = 0;
};

// The CTAs' spread over two traced launches `a` and `b` of one call (us): launch a's streams'
// min, median, mean and max; `tail` = max - mean, the most that handing the work out by the
// CTAs' pace could save; `lone` / `shared` the mean stream of the CTAs alone on their
// multiprocessor and of those sharing it (0 where there are none); `sm_corr` the correlation,
// over the multiprocessors of both launches, of a multiprocessor's mean stream in a and in b:
// near 1 the same multiprocessors are slow in every launch (the chip's layout), near 0 chance;
// `slow_sms` the multiprocessors of launch a's slowest tenth of CTAs, ascending.
struct Tail {
  double min = 0, p50 = 0, mean = 0, max = 0, tail = 0, lone = 0, shared = 0, sm_corr = 0;
  std::vector<int> slow_sms;
};

inline std::map<int, std::pair<double, int>> per_sm(const std::vector<CtaRun>& runs) {
  std::map<int, std::pair<double, int>> out;  // sm -> (sum of streams, CTAs)
  for (const CtaRun& r : runs) {
    out[r.sm].first += r.stream_us;
    out[r.sm].second += 1;
  }
  return out;
}

inline Tail read_tail(const std::vector<CtaRun>& a, const std::vector<CtaRun>& b) {
  Tail t;
  if (a.empty()) return t;
  Stat s, lone, shared;
  const std::map<int, std::pair<double, int>> sa = per_sm(a), sb = per_sm(b);
  for (const CtaRun& r : a) {
    s.add(r.stream_us);
    (sa.at(r.sm).second == 1 ? lone : shared).add(r.stream_us);
  }
  t.min = s.pct(0.0);
  t.p50 = s.pct(0.5);
  t.mean = s.mean();
  t.max = s.pct(1.0);
  t.tail = t.max - t.mean;
  t.lone = lone.mean();
  t.shared = shared.mean();
  std::vector<std::pair<double, double>> xy;
  for (const auto& [sm, sum_a] : sa) {
    const auto it = sb.find(sm);
    if (it != sb.end())
      xy.emplace_back(sum_a.first / sum_a.second, it->second.first / it->second.second);
  }
  double mx = 0, my = 0;
  for (const auto& [x, y] : xy) {
    mx += x / xy.size();
    my += y / xy.size();
  }
  double sxy = 0, sxx = 0, syy = 0;
  for (const auto& [x, y] : xy) {
    sxy += (x - mx) * (y - my);
    sxx += (x - mx) * (x - mx);
    syy += (y - my) * (y - my);
  }
  t.sm_corr = sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
  std::vector<CtaRun> sorted = a;
  std::sort(sorted.begin(), sorted.end(),
            [](const CtaRun& x, const CtaRun& y) { return x.stream_us > y.stream_us; });
  for (size_t i = 0; i < std::max<size_t>(1, sorted.size() / 10); ++i)
    t.slow_sms.push_back(sorted[i].sm);
  std::sort(t.slow_sms.begin(), t.slow_sms.end());
  return t;
}

// A Tail as JSON fields.
inline std::string tail_fields(const Tail& t) {
  std::string sms;
  for (size_t i = 0; i < t.slow_sms.size(); ++i)
    sms += (i ? ", " : "") + std::to_string(t.slow_sms[i]);
  // the list of multiprocessors grows with the CTAs (a tenth of them): appended, not formatted
  // into the fixed buffer (a 1,024-CTA launch's overran it and cut the line short)
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "\"stream_min_us\": %.2f, \"stream_p50_us\": %.2f, \"stream_mean_us\": %.2f, "
                "\"stream_max_us\": %.2f, \"tail_us\": %.2f, \"lone_stream_us\": %.2f, "
                "\"shared_stream_us\": %.2f, \"sm_corr\": %.3f, ",
                t.min, t.p50, t.mean, t.max, t.tail, t.lone, t.shared, t.sm_corr);
  return std::string(buf) + "\"slow_sms\": [" + sms + "]";
}

// read_tail on made-up launches whose figures are worked out by hand: four CTAs on
// multiprocessors 0, 0, 1, 2 with streams 1, 1, 2, 3 us; launch b the same 0.5 us slower
// (correlation 1) or in the opposite order (-1). (read, expected) pairs for selftest_verdict.
// And tail_fields of a tenth of 1,024 CTAs (103 multiprocessors, 100 .. 202): the whole list,
// its last entry and the closing bracket at the end.
inline std::vector<std::pair<double, double>> tail_selftest() {
  const std::vector<CtaRun> a = {{0, 1}, {0, 1}, {1, 2}, {2, 3}};
  const std::vector<CtaRun> b = {{0, 1.5}, {0, 1.5}, {1, 2.5}, {2, 3.5}};
  const std::vector<CtaRun> r = {{0, 3}, {0, 3}, {1, 2}, {2, 1}};
  const Tail t = read_tail(a, b), u = read_tail(a, r);
  Tail wide;
  for (int sm = 100; sm <= 202; ++sm) wide.slow_sms.push_back(sm);
  const std::string f = tail_fields(wide);
  const std::string end = ", 202]";
  const bool whole =
      f.size() > end.size() && f.compare(f.size() - end.size(), end.size(), end) == 0;
  return {{t.min, 1}, {t.p50, 2}, {t.mean, 1.75}, {t.max, 3}, {t.tail, 1.25}, {t.lone, 2.5},
          {t.shared, 1}, {t.sm_corr, 1}, {u.sm_corr + 2, 1},
          {static_cast<double>(t.slow_sms.size()), 1}, {static_cast<double>(t.slow_sms[0]), 2},
          {whole ? 1.0 : 0.0, 1}};
}

// A harness's --selftest verdict: each (read, expected) pair of `got` equal within 1e-6
// (relative), the read timeline's fields printed; 0 where all are.
inline int selftest_verdict(const std::vector<std::pair<double, double>>& got,
                            const std::string& fields) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i].first - got[i].second) > 1e-6 * std::max(1.0, got[i].second)) {
      std::fprintf(stderr, "selftest: value %zu is %.6f, not %.6f\n", i, got[i].first,
                   got[i].second);
      ++bad;
    }
  }
  std::printf("{\"selftest\": %s, %s}\n", bad ? "false" : "true", fields.c_str());
  return bad ? 1 : 0;
}

// Cycles per us of a launch's clock: over the CTAs of a timeline (`tr`, `stride` words a CTA),
// the clock slots c0 .. c1 against the %globaltimer slots g0 .. g1 (ns); the first and last
// %globaltimer stamps in t_first / t_last.
inline double clock_per_us(const std::vector<unsigned long long>& tr, int ctas, int stride,
                           int c0, int c1, int g0, int g1, uint64_t& t_first, uint64_t& t_last) {
  double cyc = 0, ns = 0;
  t_first = ~0ull;
  t_last = 0;
  for (int b = 0; b < ctas; ++b) {
    const unsigned long long* t = tr.data() + static_cast<size_t>(b) * stride;
    if (t[g1] <= t[g0] || t[c1] <= t[c0]) continue;
    cyc += static_cast<double>(t[c1] - t[c0]);
    ns += static_cast<double>(t[g1] - t[g0]);
    t_first = std::min<uint64_t>(t_first, t[g0]);
    t_last = std::max<uint64_t>(t_last, t[g1]);
  }
  return ns > 0 ? 1e3 * cyc / ns : 1.0;
}

}  // namespace attn_trace_common
