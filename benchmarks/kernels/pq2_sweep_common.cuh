// What the PQ2 kernel sweeps outside torch share (pq2_gemv_sweep.cu, pq2_small_sweep.cu):
// random weight planes in copies that together exceed three times the L2 (so every launch of
// a timed graph reads DRAM), a random int8 activation, the host reference of the formula in
// csrc/pq2/pq2_params.cuh, a streaming-read probe (the ceiling of one kernel reading that
// many bytes, and on 2 GiB the sustained read bandwidth) and the CUDA-graph timer.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,                 \
                   cudaGetErrorString(e_));                                          \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace pq2_sweep {

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
    p[i] = __float2half(
        ldexpf(1.f + (mix(i, seed) & 1023) / 1024.f, -9 + int(mix(i, seed + 1) % 3)));
}

// Streaming read of `n16` 16-byte words (no L1 allocation), four loads in flight per thread
// per iteration; the XOR is stored only if it hits a value random data never gives.
__global__ void read_probe(const uint4* p, int64_t n16, unsigned* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w)
                   : "l"(p + i + j * stride));
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

inline float half_to_float(uint16_t h) {
  __half x;
  std::memcpy(&x, &h, 2);
  return __half2float(x);
}

struct Shape {
  int n, k;
};

inline std::vector<Shape> parse_shapes(const char* s) {
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

// xorshift64: the host's random stream of the sweeps and probes
struct XorShift {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// 0 .. n - 1 in a random order (a paged cache's block table)
inline std::vector<int32_t> shuffled_blocks(int n, uint64_t seed = 0x2545F4914F6CDD1Dull) {
  std::vector<int32_t> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  XorShift r{seed};
  for (int i = n - 1; i > 0; --i)
    std::swap(order[i], order[static_cast<int>(r.next() % static_cast<uint64_t>(i + 1))]);
  return order;
}

inline std::vector<int> parse_ints(const char* s) {
  std::vector<int> out;
  for (const char* q = s; *q;) {
    out.push_back(std::atoi(q));
    while (*q && *q != ',') ++q;
    if (*q == ',') ++q;
  }
  return out;
}

// A comma-separated list of names ("fp32,fp16"): its entries, in order.
inline std::vector<std::string> parse_names(const char* s) {
  std::vector<std::string> out;
  for (const char* q = s; *q;) {
    const char* e = q;
    while (*e && *e != ',') ++e;
    out.emplace_back(q, e);
    q = *e ? e + 1 : e;
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

// The sustained read bandwidth, GB/s: the probe on 2 GiB.
inline double sustained_read_gbps(int sms, cudaStream_t s, unsigned* sink) {
  const int64_t big = 2LL << 30;
  uint4* bigbuf;
  CHECK(cudaMalloc(&bigbuf, big));
  fill_words<<<4 * sms, 256, 0, s>>>(reinterpret_cast<uint32_t*>(bigbuf), big / 4, 7);
  const double us = time_graph(
      4, [&](int) { read_probe<<<sms * 8, 512, 0, s>>>(bigbuf, big / 16, sink);
                    return cudaGetLastError(); }, s);
  CHECK(cudaFree(bigbuf));
  return big / us / 1e3;
}

// Device 0, its multiprocessors, a stream and the sustained read bandwidth, printed as the
// run's first JSON line.
struct SweepDevice {
  int sms = 0;
  cudaStream_t s = nullptr;
  unsigned* sink = nullptr;  // the probe's output
  double read_gbps = 0;
  SweepDevice() {
    CHECK(cudaSetDevice(0));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&sink, 4));
    read_gbps = sustained_read_gbps(sms, s, sink);
    std::printf("{\"gpu\": \"%s\", \"sms\": %d, \"read_gbps\": %.0f}\n", prop.name, sms,
                read_gbps);
    std::fflush(stdout);
  }
};

// `copies` copies of one N x K matrix's random planes, each `slab` bytes: int32 codes
// [N, K/16], then fp16 scales [N, gpad] (the group count padded to 8, as the library's).
struct WeightSlabs {
  int n = 0, k = 0, g128 = 0, gpad = 0, copies = 0;
  int64_t code_bytes = 0, scale_bytes = 0, slab = 0;
  char* base = nullptr;

  WeightSlabs(int n_, int k_, int sms, cudaStream_t s) : n(n_), k(k_) {
    g128 = (k + 127) / 128;
    gpad = (g128 + 7) / 8 * 8;
    code_bytes = int64_t(n) * k / 4;
    scale_bytes = int64_t(n) * gpad * 2;
    slab = (code_bytes + scale_bytes + 255) / 256 * 256;
    copies = static_cast<int>(std::min<int64_t>(
        64, std::max<int64_t>(2, (3 * kL2Bytes + slab - 1) / slab + 1)));
    CHECK(cudaMalloc(&base, slab * copies));
    fill_words<<<4 * sms, 256, 0, s>>>(reinterpret_cast<uint32_t*>(base), slab * copies / 4, 11);
    for (int c = 0; c < copies; ++c)
      fill_scales<<<4 * sms, 256, 0, s>>>(reinterpret_cast<__half*>(scales_bytes(c)),
                                           int64_t(n) * gpad, 13 + c);
  }
  ~WeightSlabs() { cudaFree(base); }
  WeightSlabs(const WeightSlabs&) = delete;
  WeightSlabs& operator=(const WeightSlabs&) = delete;

  char* scales_bytes(int c) const { return base + c * slab + code_bytes; }
  const int32_t* codes(int c) const { return reinterpret_cast<const int32_t*>(base + c * slab); }
  const uint16_t* scales(int c) const {
    return reinterpret_cast<const uint16_t*>(scales_bytes(c));
  }
  // launches a sweep times per configuration: whole rounds of the copies, at least 64
  int calls() const { return copies * std::max(1, (64 + copies - 1) / copies); }
};

// A random int8 activation [mmax, K] and fp32 group scales [mmax, g128].
inline void random_activation(int mmax, int k, int g128, std::vector<int8_t>& hx,
                              std::vector<float>& hsx) {
  hx.assign(int64_t(mmax) * k, 0);
  hsx.assign(int64_t(mmax) * g128, 0.f);
  uint32_t r = 12345;
  for (auto& v : hx) { r = r * 1664525u + 1013904223u; v = int8_t(int(r >> 24) % 255 - 127); }
  for (auto& v : hsx) { r = r * 1664525u + 1013904223u; v = 0.001f + (r >> 8) * 1e-10f; }
}

// random_activation on the host and the device: int8 [mmax, K], fp32 group scales and int32
// group sums [mmax, g128] (the sums for the tensor-core kernels; the GEMV does not read them).
struct DeviceActivation {
  std::vector<int8_t> hx;
  std::vector<float> hsx;
  int8_t* dx = nullptr;
  float* dsx = nullptr;
  int32_t* dq = nullptr;
  DeviceActivation(int mmax, int k, int g128) {
    random_activation(mmax, k, g128, hx, hsx);
    std::vector<int32_t> hq(int64_t(mmax) * g128, 0);
    for (int m = 0; m < mmax; ++m)
      for (int e = 0; e < k; ++e) hq[int64_t(m) * g128 + e / 128] += hx[int64_t(m) * k + e];
    CHECK(cudaMalloc(&dx, hx.size()));
    CHECK(cudaMalloc(&dsx, 4 * hsx.size()));
    CHECK(cudaMalloc(&dq, 4 * hq.size()));
    CHECK(cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dsx, hsx.data(), 4 * hsx.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dq, hq.data(), 4 * hq.size(), cudaMemcpyHostToDevice));
  }
  ~DeviceActivation() {
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dsx));
    CHECK(cudaFree(dq));
  }
  DeviceActivation(const DeviceActivation&) = delete;
  DeviceActivation& operator=(const DeviceActivation&) = delete;
};

// The host reference of copy 0 for `rows` and every activation row m < mmax, as
// ref[i * mmax + m] for rows[i]; ref_max: the largest magnitude.
inline std::vector<double> host_reference(const WeightSlabs& w, const std::vector<int8_t>& hx,
                                          const std::vector<float>& hsx, int mmax,
                                          const std::vector<int>& rows, double& ref_max) {
  const int k = w.k, g128 = w.g128;
  std::vector<uint32_t> hc(w.code_bytes / 4);
  std::vector<uint16_t> hs(int64_t(w.n) * w.gpad);
  CHECK(cudaMemcpy(hc.data(), w.codes(0), w.code_bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hs.data(), w.scales(0), w.scale_bytes, cudaMemcpyDeviceToHost));
  std::vector<double> ref(rows.size() * mmax);
  ref_max = 0;
  std::vector<int8_t> val(k);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int row = rows[i];
    for (int idx = 0; idx < k; ++idx) {
      const int wd = idx / 16, q = (idx % 16) / 4, b = idx % 4;
      val[idx] = int8_t(((hc[int64_t(row) * (k / 16) + wd] >> (8 * b + 2 * q)) & 3) - 1);
    }
    for (int m = 0; m < mmax; ++m) {
      double y = 0;
      for (int g = 0; g < k / 128; ++g) {
        int64_t dot = 0;
        for (int e = g * 128; e < g * 128 + 128; ++e)
          dot += int64_t(val[e]) * hx[int64_t(m) * k + e];
        y += double(dot) * half_to_float(hs[int64_t(row) * w.gpad + g]) *
             hsx[int64_t(m) * g128 + g];
      }
      ref[i * mmax + m] = y;
      ref_max = std::max(ref_max, std::fabs(y));
    }
  }
  return ref;
}

}  // namespace pq2_sweep
