// PQ2 GEMV for M = 1 (see gemv_int8.cuh). Torch-free; the torch op is in gemv_int8_op.cu.
//
// Layout of the work: K splits into warp slices of up to 32 lanes x kSlots x 64 weights
// (6144); a CTA has wk warps per row set (wk = K slices) times wn row sets of kRows rows.
// Per 64-weight code group the integer dot minus the activation's own sum over those 64
// values (computed once) is exact; it is scaled by the weight's and the activation's group
// scales in fp32. Partial sums of a row's K slices meet in shared memory.
#include "gemv_int8.cuh"

#include "pq2_device.cuh"

namespace vllm_prism {
namespace {

constexpr int kSlots = 3;                  // 16-byte code groups per lane per row
constexpr int kWarpK = 32 * kSlots * 64;   // weights per warp slice
constexpr int kDepth = 4;                  // rows in flight per warp
constexpr uint32_t kMask = 0x03030303u;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One code group (16 codes x 4 words) against its 64 activation bytes.
__device__ __forceinline__ int dot64(const uint4& w, const int4 (&x)[4]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  int acc = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t c = words[i];
    acc = __dp4a(static_cast<int>(c & kMask), x[i].x, acc);
    acc = __dp4a(static_cast<int>((c >> 2) & kMask), x[i].y, acc);
    acc = __dp4a(static_cast<int>((c >> 4) & kMask), x[i].z, acc);
    acc = __dp4a(static_cast<int>((c >> 6) & kMask), x[i].w, acc);
  }
  return acc;
}

template <int ROWS>
__global__ void __launch_bounds__(256)
    pq2_gemv_int8_kernel(const __grid_constant__ Pq2LinearParams p, int wk, int wn) {
  extern __shared__ float partial[];  // [wn * ROWS][wk], used when wk > 1
  if (p.pdl) pdl_launch_dependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kw = warp % wk, nw = warp / wk;
  const int row_base = (blockIdx.x * wn + nw) * ROWS;
  const int groups = p.k / 64;  // 16-byte code groups per row
  int u[kSlots];
  bool valid[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    u[s] = kw * (32 * kSlots) + lane + 32 * s;
    valid[s] = u[s] < groups;
  }

  uint4 ring[kDepth][kSlots];
  uint16_t dring[kDepth][kSlots];
  auto load_row = [&](int r) {
    const int row = min(row_base + r, p.n - 1);
    const uint4* codes = reinterpret_cast<const uint4*>(p.codes + row * p.stride_c);
    const uint16_t* scales = p.scales + row * p.stride_s;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (valid[s]) {
        ring[r % kDepth][s] = __ldg(codes + u[s]);
        dring[r % kDepth][s] = __ldg(scales + (u[s] >> 1));
      }
    }
  };
#pragma unroll
  for (int r = 0; r < kDepth && r < ROWS; ++r) load_row(r);
  if (p.pdl) pdl_wait();  // the activation is complete past here

  int4 x[kSlots][4];
  float sx[kSlots];
  int xsum[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    xsum[s] = 0;
    sx[s] = 0.f;
    if (valid[s]) {
      const int4* xs = reinterpret_cast<const int4*>(p.xq + 64 * u[s]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[s][i] = __ldg(xs + i);
        xsum[s] = __dp4a(0x01010101, x[s][i].x, xsum[s]);
        xsum[s] = __dp4a(0x01010101, x[s][i].y, xsum[s]);
        xsum[s] = __dp4a(0x01010101, x[s][i].z, xsum[s]);
        xsum[s] = __dp4a(0x01010101, x[s][i].w, xsum[s]);
      }
      sx[s] = __ldg(p.sx + (u[s] >> 1));
    }
  }

#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float acc = 0.f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (valid[s]) {
        const int dot = dot64(ring[r % kDepth][s], x[s]) - xsum[s];
        const float d = __half2float(__ushort_as_half(dring[r % kDepth][s]));
        acc += exact_float(dot) * (d * sx[s]);
      }
    }
    if (r + kDepth < ROWS) load_row(r + kDepth);
    acc = warp_sum(acc);
    const int row = row_base + r;
    if (wk == 1) {
      if (lane == 0 && row < p.n) {
        const float b = p.bias ? load_as_float(p.bias, row, p.bias_dtype) : 0.f;
        store_out(p, row, acc + b);
      }
    } else if (lane == 0) {
      partial[(nw * ROWS + r) * wk + kw] = acc;
    }
  }
  if (wk > 1) {
    __syncthreads();
    const int t = threadIdx.x;
    if (t < wn * ROWS) {
      const int row = blockIdx.x * wn * ROWS + t;
      float acc = 0.f;
      for (int i = 0; i < wk; ++i) acc += partial[t * wk + i];
      if (row < p.n) {
        const float b = p.bias ? load_as_float(p.bias, row, p.bias_dtype) : 0.f;
        store_out(p, row, acc + b);
      }
    }
  }
}

template <int ROWS>
cudaError_t launch(const Pq2LinearParams& p, int wk, int wn, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  const int rows_per_cta = wn * ROWS;
  cfg.gridDim = dim3((p.n + rows_per_cta - 1) / rows_per_cta, 1, 1);
  cfg.blockDim = dim3(32 * wk * wn, 1, 1);
  cfg.dynamicSmemBytes = wk > 1 ? sizeof(float) * rows_per_cta * wk : 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(cfg, attr, p.pdl);
  return cudaLaunchKernelEx(&cfg, pq2_gemv_int8_kernel<ROWS>, p, wk, wn);
}

}  // namespace

cudaError_t pq2_gemv_int8_launch(const Pq2LinearParams& p, int sm_count, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  if (p.m != 1 || p.k % 64 != 0 || p.split != 1) return cudaErrorInvalidValue;
  const int wk = (p.k + kWarpK - 1) / kWarpK;  // warps per row set
  if (wk > 8) return cudaErrorInvalidValue;    // K > 49152
  const int wn = wk >= 4 ? 1 : 4 / wk;         // row sets per CTA: 4 to 8 warps a CTA
  // Eight rows a warp where that still gives every multiprocessor eight warps, else four.
  const int64_t warps8 = (static_cast<int64_t>(p.n) + 7) / 8 * wk;
  if (warps8 >= 8 * static_cast<int64_t>(sm_count)) return launch<8>(p, wk, wn, stream);
  return launch<4>(p, wk, wn, stream);
}

}  // namespace vllm_prism
