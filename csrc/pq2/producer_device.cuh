// The activation producer's device code (see producer.cuh) for the GEMV with the producer in
// its launch (gemv_int8.cu): 16-bit loads and stores and the per-thread unit of 32 values.
#pragma once

#include "pq2_device.cuh"
#include "producer.cuh"

namespace vllm_prism {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float bits_to_float(uint32_t bits, int dtype) {
  return dtype == 2 ? __uint_as_float(bits << 16) : __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ uint32_t float_to_bits(float v, int dtype) {
  return dtype == 2 ? __bfloat16_as_ushort(__float2bfloat16_rn(v))
                    : __half_as_ushort(__float2half_rn(v));
}

// 8 consecutive fp16 / bf16 values from element i of `base` (i % 8 == 0) as floats: one
// 16-byte load where `vec` (16-byte aligned base), else eight 2-byte loads.
__device__ __forceinline__ void load8(float (&v)[8], const void* base, int64_t i, int dtype,
                                      bool vec) {
  const uint16_t* b = static_cast<const uint16_t*>(base) + i;
  uint32_t w[4];
  if (vec) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(b));
    w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = static_cast<uint32_t>(__ldg(b + 2 * j)) |
             (static_cast<uint32_t>(__ldg(b + 2 * j + 1)) << 16);
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = bits_to_float(w[j] & 0xffffu, dtype);
    v[2 * j + 1] = bits_to_float(w[j] >> 16, dtype);
  }
}

// The 8 values `v` rounded to fp16 / bf16 at element i of `base` (i % 8 == 0).
__device__ __forceinline__ void store8(void* base, int64_t i, const float* v, int dtype,
                                       bool vec) {
  uint16_t* b = static_cast<uint16_t*>(base) + i;
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w[j] = float_to_bits(v[2 * j], dtype) | (float_to_bits(v[2 * j + 1], dtype) << 16);
  }
  if (vec) {
    *reinterpret_cast<uint4*>(b) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = static_cast<uint16_t>(w[j / 2] >> (16 * (j % 2)));
  }
}

// One thread's share of the producer: the 32 values of unit u = threadIdx.x (values 32u ..
// 32u + 31; the CTA has at least K / 32 threads, so a warp holds 1024 consecutive values and
// the block Hadamard, at most 1024, runs in registers and lane shuffles), quantized to int8 per
// 128-group over four lanes. Every thread of the CTA calls it (one barrier when the norm spans
// the whole row; red: 32 floats of shared memory); false for a thread whose warp holds no unit
// (warp-uniform). write_res: this CTA writes x + residual to res_out. (The fused GEMV refuses a
// prologue whose result is returned: the extra live range costs spills.)
struct ProducedUnit {
  uint32_t words[8];  // the unit's 32 int8 codes, 4 a word, in order
  int sum;            // their sum
  float amax;         // max |value| of the unit's 128-group (its four lanes)
  bool mine;          // u < K / 32: the unit exists (its lanes' stores count)
};

__device__ __forceinline__ bool produce_unit(int k, const Pq2PrologueParams& q, bool write_res,
                                             float* red, ProducedUnit& pu) {
  const int units = k / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int u = threadIdx.x;  // this thread's unit
  const bool active = warp * 32 < units, mine = u < units;  // active: warp-uniform
  const int64_t e0 = static_cast<int64_t>(u) * 32;
  float v[32];
  float ss = 0.f;
  // 1. silu(gate) * up, plus the residual (the sum written back where write_res)
  if (active) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float a[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) a[j] = 0.f;
      if (mine) {
        load8(a, q.x, e0 + 8 * c, q.x_dtype, q.x_vec);
        if (q.glu) {
          float b[8];
          load8(b, q.x, k + e0 + 8 * c, q.x_dtype, q.x_vec);
#pragma unroll
          for (int j = 0; j < 8; ++j) a[j] = a[j] / (1.f + __expf(-a[j])) * b[j];
        }
        if (q.res != nullptr) {
          float r[8];
          load8(r, q.res, e0 + 8 * c, q.x_dtype, q.res_vec);
#pragma unroll
          for (int j = 0; j < 8; ++j) a[j] += r[j];
          if (write_res) store8(q.res_out, e0 + 8 * c, a, q.x_dtype, q.res_vec);
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        v[8 * c + j] = a[j];
        ss += a[j] * a[j];
      }
    }
  }
  // 2. the RMSNorm: over the whole row (a block reduction) or per rms_group values
  const bool row_norm = q.rms_w != nullptr && q.rms_group == 0;
  float rstd = 0.f;
  if (row_norm) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(kFull, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t += red[w];
    rstd = 1.f / sqrtf(t / k + q.eps);
  }
  pu.mine = mine;
  if (!active) return false;
  if (q.rms_w != nullptr) {
    int64_t w0 = e0;
    if (!row_norm) {  // rms_group >= 32 values: rms_group / 32 lanes
      for (int o = 1; o < q.rms_group / 32; o <<= 1) ss += __shfl_xor_sync(kFull, ss, o);
      rstd = 1.f / sqrtf(ss / q.rms_group + q.eps);
      w0 = e0 % q.rms_group;
    }
    if (mine) {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        v[i] = v[i] * rstd * (load_as_float(q.rms_w, w0 + i, q.rms_dtype) + q.rms_offset);
      }
    }
  }
  // 3. times act(gate), times the signs
  if (q.gate != nullptr && mine) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float z[8];
      load8(z, q.gate, e0 + 8 * c, q.x_dtype, q.gate_vec);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float sig = 1.f / (1.f + __expf(-z[j]));
        v[8 * c + j] *= q.gate_sigmoid ? sig : z[j] * sig;
      }
    }
  }
  if (q.signs != nullptr && mine) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const float4 sg = __ldg(reinterpret_cast<const float4*>(q.signs + e0) + c);
      v[4 * c] *= sg.x, v[4 * c + 1] *= sg.y, v[4 * c + 2] *= sg.z, v[4 * c + 3] *= sg.w;
    }
  }
  // 4. the block Hadamard, stage by stage as the Triton producer: in the lane's values, then
  // across lanes (the lower of a pair keeps a + b, the upper a - b)
  if (q.log_b > 0) {
#pragma unroll
    for (int st = 0; st < 5; ++st) {
      if (st < q.log_b) {
        const int d = 1 << st;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          if ((i & d) == 0) {
            const float a = v[i], b = v[i | d];
            v[i] = a + b;
            v[i | d] = a - b;
          }
        }
      }
    }
#pragma unroll
    for (int st = 5; st < 10; ++st) {
      if (st < q.log_b) {
        const int d = 1 << (st - 5);
        const bool upper = (lane & d) != 0;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float o = __shfl_xor_sync(kFull, v[i], d);
          v[i] = upper ? o - v[i] : v[i] + o;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] *= q.inv_sqrt_b;
  }
  // 5. int8 per 128-group (four lanes): scale max|x| / 127, round half away from zero
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, 2));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  int sum = 0;
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    uint32_t w = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int qv = round_q8(v[4 * c + b] * inv);
      sum += qv;
      w |= (static_cast<uint32_t>(qv) & 0xffu) << (8 * b);
    }
    pu.words[c] = w;
  }
  pu.sum = sum;
  pu.amax = amax;
  return true;
}

}  // namespace vllm_prism
