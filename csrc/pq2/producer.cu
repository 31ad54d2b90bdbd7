// The PQ2 activation producer on its own (see producer.cuh). Torch-free; the torch op is in
// producer_op.cu.
//
// One CTA per (activation row, 1024-value tile), 128 threads of 8 consecutive values each, so
// a row of K = 5120 is spread over five multiprocessors and each thread's chain is short (the
// first version, one CTA a row and 32 values a thread, measured 5-8 us a call against the
// Triton producer's 1.9-2.7 us on an H200: a single multiprocessor's latency-bound chain).
// The prologue runs on the thread's 8 values; the whole-row RMSNorm has every CTA sum the
// squares of the whole row (all its loads issued at once: the row is in L2), a per-group norm
// reduces over the group's lanes (and warps). The block Hadamard (at most the tile) runs
// stage by stage as the Triton producer: 3 stages in the thread's values, 5 across the lanes
// of a warp, 2 across the warps through shared memory. Each 128-group's 16 lanes quantize it
// and write its codes, scale and code sum in the layout of ActKind.Q8 (kernels/pq2/hadamard.py).
#include "producer.cuh"

#include "producer_device.cuh"

namespace vllm_prism {
namespace {

constexpr int kTile = 1024;                 // values of a CTA (the widest Hadamard block)
constexpr int kVals = 8;                    // values of a thread
constexpr int kThreads = kTile / kVals;     // 128
constexpr int kWarps = kThreads / 32;       // 4
constexpr int kUnrolledTiles = 8;           // whole-row norm: tiles whose loads go out at once

__device__ __forceinline__ const void* row_of(const void* base, int64_t row, int64_t stride) {
  return base == nullptr ? nullptr : static_cast<const uint16_t*>(base) + row * stride;
}

__device__ __forceinline__ void* row_of(void* base, int64_t row, int64_t stride) {
  return base == nullptr ? nullptr : static_cast<uint16_t*>(base) + row * stride;
}

// The raw 16-bit values of one thread's 8 values of a row: x, x's second half (glu) and the
// residual.
struct Raw8 {
  uint4 x, up, r;
};

__device__ __forceinline__ void load_tile(Raw8& w, const Pq2PrologueParams& q, const void* x,
                                          const void* res, int k, int64_t e) {
  w.x = load_raw8(x, e, q.x_vec);
  if (q.glu) w.up = load_raw8(x, k + e, q.x_vec);
  if (res != nullptr) w.r = load_raw8(res, e, q.res_vec);
}

// The prologue before the norm on loaded values: silu(x[:K]) * x[K:] with glu, plus the
// residual.
__device__ __forceinline__ void prologue8(float (&a)[8], const Raw8& w, const Pq2PrologueParams& q,
                                          bool has_res) {
  to_float8(a, w.x, q.x_dtype);
  if (q.glu) {
    float b[8];
    to_float8(b, w.up, q.x_dtype);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = a[j] / (1.f + __expf(-a[j])) * b[j];
  }
  if (has_res) {
    float r[8];
    to_float8(r, w.r, q.x_dtype);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] += r[j];
  }
}

__device__ __forceinline__ float sum8sq(const float (&a)[8]) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += a[j] * a[j];
  return s;
}

// The sum of `v` over the CTA's threads (red: kWarps floats; every thread calls it).
__device__ __forceinline__ float cta_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t += red[w];
  return t;
}

// The sum of `v` over the threads of a group of `lanes` consecutive threads (a power of two
// up to kThreads; red: kWarps floats; every thread calls it).
__device__ __forceinline__ float group_sum(float v, int lanes, float* red) {
  for (int o = 1; o < min(lanes, 32); o <<= 1) v += __shfl_xor_sync(kFull, v, o);
  if (lanes <= 32) return v;
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  const int warps = lanes / 32, first = (threadIdx.x >> 5) / warps * warps;
  float t = 0.f;
  for (int w = 0; w < warps; ++w) t += red[first + w];
  return t;
}

// Whole-row norm: the prologue of the row's tiles at this thread's place from their loaded
// values (w: the first kUnrolledTiles; the rest loaded here), the own tile's kept in v;
// returns the thread's sum of squares.
__device__ __forceinline__ float whole_row(float (&v)[8], const Raw8 (&w)[kUnrolledTiles],
                                           const Pq2PrologueParams& q, const void* x,
                                           const void* res, int k, int tile) {
  float ss = 0.f;
  const int tiles = (k + kTile - 1) / kTile;
  const auto add = [&](int j, const Raw8& raw) {
    float a[8];
    prologue8(a, raw, q, res != nullptr);
    ss += sum8sq(a);
    if (j == tile) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = a[i];
    }
  };
#pragma unroll
  for (int j = 0; j < kUnrolledTiles; ++j) {
    if (j < tiles && static_cast<int64_t>(j) * kTile + kVals * threadIdx.x < k) add(j, w[j]);
  }
  for (int j = kUnrolledTiles; j < tiles; ++j) {
    const int64_t e = static_cast<int64_t>(j) * kTile + kVals * threadIdx.x;
    if (e >= k) continue;
    Raw8 rest;
    load_tile(rest, q, x, res, k, e);
    add(j, rest);
  }
  return ss;
}

// The block Hadamard's stages 8 and 9 (values 256 and 512 apart: the CTA's warps) through
// shared memory, in the stage order of the others (hs: kTile floats).
__device__ __forceinline__ void hadamard_across_warps(float (&v)[8], int log_b, float* hs) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  float4* h4 = reinterpret_cast<float4*>(hs);
  h4[2 * t] = make_float4(v[0], v[1], v[2], v[3]);
  h4[2 * t + 1] = make_float4(v[4], v[5], v[6], v[7]);
  __syncthreads();
  float a[4][8];  // the same place in each warp
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const int s = lane + 32 * w;
    const float4 lo = h4[2 * s], hi = h4[2 * s + 1];
    a[w][0] = lo.x, a[w][1] = lo.y, a[w][2] = lo.z, a[w][3] = lo.w;
    a[w][4] = hi.x, a[w][5] = hi.y, a[w][6] = hi.z, a[w][7] = hi.w;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float b0 = a[0][i] + a[1][i], b1 = a[0][i] - a[1][i];  // stage 8: warps 0-1, 2-3
    const float b2 = a[2][i] + a[3][i], b3 = a[2][i] - a[3][i];
    if (log_b == 9) {
      v[i] = warp == 0 ? b0 : warp == 1 ? b1 : warp == 2 ? b2 : b3;
    } else {  // stage 9: warps 0-2, 1-3
      v[i] = warp == 0 ? b0 + b2 : warp == 1 ? b1 + b3 : warp == 2 ? b0 - b2 : b1 - b3;
    }
  }
}

// The block Hadamard of 2^log_b values (1..10), stage by stage as the Triton producer: in the
// thread's values, then across lanes (the lower of a pair keeps a + b, the upper a - b), then
// across warps.
__device__ __forceinline__ void hadamard(float (&v)[8], int log_b, float inv_sqrt_b, float* hs) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int st = 0; st < 3; ++st) {
    if (st < log_b) {
      const int d = 1 << st;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if ((i & d) == 0) {
          const float a = v[i], b = v[i | d];
          v[i] = a + b;
          v[i | d] = a - b;
        }
      }
    }
  }
#pragma unroll
  for (int st = 3; st < 8; ++st) {
    if (st < log_b) {
      const int d = 1 << (st - 3);
      const bool upper = (lane & d) != 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float o = __shfl_xor_sync(kFull, v[i], d);
        v[i] = upper ? o - v[i] : v[i] + o;
      }
    }
  }
  if (log_b > 8) hadamard_across_warps(v, log_b, hs);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] *= inv_sqrt_b;
}

__global__ void __launch_bounds__(kThreads)
    pq2_produce_int8_kernel(const __grid_constant__ Pq2PrologueParams q,
                            const __grid_constant__ Pq2ProducerOut out, int k, bool pdl) {
  __shared__ __align__(16) float hs[kTile];
  __shared__ float red[kWarps];
  if (pdl) {  // let the linear's kernel launch, then wait for this one's inputs
    pdl_launch_dependents();
    pdl_wait();
  }
  const int64_t row = blockIdx.x;
  const int tile = blockIdx.y, lane = threadIdx.x & 31;
  const int64_t e0 = static_cast<int64_t>(tile) * kTile + kVals * threadIdx.x;
  const bool mine = e0 < k;  // the tail tile of a row (K % 1024) leaves threads without values
  const void* x = row_of(q.x, row, q.stride_x);
  const void* res = row_of(q.res, row, q.stride_res);
  const bool row_norm = q.rms_w != nullptr && q.rms_group == 0;

  // 1. every load of the thread, issued before any value is used: the row's first tiles at
  // this thread's place (whole-row norm) or the own tile; the norm's weights, the gate, the
  // signs
  Raw8 w[kUnrolledTiles];
  if (row_norm) {
    const int tiles = (k + kTile - 1) / kTile;
#pragma unroll
    for (int j = 0; j < kUnrolledTiles; ++j) {
      const int64_t e = static_cast<int64_t>(j) * kTile + kVals * threadIdx.x;
      if (j < tiles && e < k) load_tile(w[j], q, x, res, k, e);
    }
  } else if (mine) {
    load_tile(w[0], q, x, res, k, e0);
  }
  float nw[8];
  if (q.rms_w != nullptr && mine) {
    const int64_t w0 = row_norm ? e0 : e0 % q.rms_group;
#pragma unroll
    for (int i = 0; i < 8; ++i) nw[i] = load_as_float(q.rms_w, w0 + i, q.rms_dtype);
  }
  uint4 zr = make_uint4(0u, 0u, 0u, 0u);
  if (q.gate != nullptr && mine) {
    zr = load_raw8(row_of(q.gate, row, q.stride_gate), e0, q.gate_vec);
  }
  float4 s0 = make_float4(1.f, 1.f, 1.f, 1.f), s1 = s0;
  if (q.signs != nullptr && mine) {
    const float4* sg = reinterpret_cast<const float4*>(q.signs + e0);
    s0 = __ldg(sg), s1 = __ldg(sg + 1);
  }

  // 2. silu(gate) * up, plus the residual (the sum written back), and the RMSNorm's rstd
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = 0.f;
  float rstd = 0.f;
  if (row_norm) {
    rstd = 1.f / sqrtf(cta_sum(whole_row(v, w, q, x, res, k, tile), red) / k + q.eps);
  } else {
    if (mine) prologue8(v, w[0], q, res != nullptr);
    if (q.rms_w != nullptr) {
      rstd = 1.f / sqrtf(group_sum(sum8sq(v), q.rms_group / kVals, red) / q.rms_group + q.eps);
    }
  }
  if (res != nullptr && mine) store8(row_of(q.res_out, row, k), e0, v, q.x_dtype, q.res_vec);
  // 3. the norm, times act(gate), the prologue's result stored, times the signs
  if (q.rms_w != nullptr && mine) {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = v[i] * rstd * (nw[i] + q.rms_offset);
  }
  if (q.gate != nullptr && mine) {
    float z[8];
    to_float8(z, zr, q.x_dtype);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float sig = 1.f / (1.f + __expf(-z[j]));
      v[j] *= q.gate_sigmoid ? sig : z[j] * sig;
    }
  }
  if (q.x_out != nullptr && mine) store8(row_of(q.x_out, row, k), e0, v, q.x_dtype, q.xout_vec);
  if (q.signs != nullptr && mine) {
    v[0] *= s0.x, v[1] *= s0.y, v[2] *= s0.z, v[3] *= s0.w;
    v[4] *= s1.x, v[5] *= s1.y, v[6] *= s1.z, v[7] *= s1.w;
  }
  // 4. the block Hadamard (a tail tile holds whole blocks: the block divides K)
  if (q.log_b > 0) hadamard(v, q.log_b, q.inv_sqrt_b, hs);
  // 5. int8 per 128-group (16 lanes): scale max|x| / 127, round half away from zero
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, o));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  int sum = 0;
  uint32_t codes[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float t = v[i] * inv;
    const int qa = min(static_cast<int>(fabsf(t) + 0.5f), 127);
    const int qv = t < 0.f ? -qa : qa;
    sum += qv;
    codes[i / 4] |= (static_cast<uint32_t>(qv) & 0xffu) << (8 * (i % 4));
  }
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) sum += __shfl_xor_sync(kFull, sum, o);
  if (!mine) return;
  *reinterpret_cast<uint2*>(out.xq + row * out.stride_xq + e0) = make_uint2(codes[0], codes[1]);
  if ((lane & 15) == 0) {
    out.sx[row * out.stride_g + e0 / 128] = amax / 127.f;
    out.qsum[row * out.stride_g + e0 / 128] = sum;
  }
}

}  // namespace

cudaError_t pq2_produce_int8_launch(const Pq2PrologueParams& q, const Pq2ProducerOut& out,
                                    int m, int k, bool pdl, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (k <= 0 || k % 128 != 0 || q.log_b < 0 || q.log_b > 10 ||
      (q.log_b > 0 && (q.signs == nullptr || k % (1 << q.log_b) != 0)) ||
      (q.rms_group != 0 && (q.rms_group < 32 || q.rms_group > 1024 || k % q.rms_group))) {
    return cudaErrorInvalidValue;
  }
  if (reinterpret_cast<uintptr_t>(out.xq) % 16 || out.stride_xq % 16 ||
      reinterpret_cast<uintptr_t>(q.signs) % 16) {
    return cudaErrorMisalignedAddress;
  }
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(static_cast<unsigned>(m), static_cast<unsigned>((k + kTile - 1) / kTile), 1);
  lc.blockDim = dim3(kThreads, 1, 1);
  lc.dynamicSmemBytes = 0;
  lc.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(lc, attr, pdl);
  return cudaLaunchKernelEx(&lc, pq2_produce_int8_kernel, q, out, k, pdl);
}

}  // namespace vllm_prism
