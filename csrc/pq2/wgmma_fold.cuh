// The PQ2 prefill GEMM on Hopper's warpgroup MMA with the weight scales folded into the int8
// weights (sm_90a): the same CTA, producer and tiled activation as wgmma_prefill.cuh, but the
// int32 sums are promoted once per 1024-wide block of K (the Hadamard rotation's block), not
// once per 128-group, so the consumer warpgroups issue their MMAs back to back.
//
// The weights: in the block b of row n (8 groups g), the group scale d[n, g] becomes D[n,b] *
// q[n,g] with D = max_g |d| / L (as 1 / (L / max)) and q = rint(d * L / max) in -L..L, and the
// weight (c - 1) * q an int8. L is Params::fold_levels: 63 for any codes ((c - 1) in -1..2, so
// |(c - 1) q| <= 126), 127 where the codes hold no 3 ((c - 1) in -1..1: |(c - 1) q| <= 127; the
// table's entry for code 3 wraps, and no code selects it). A lane builds each
// group's table {-q, 0, q, 2q} in one register and turns four codes into four int8 weights with
// one `prmt` (the codes as its selector nibbles: (word >> sh) & 0x3333, sh = 0, 2, 16, 18 by the
// lane's k quarter, which takes k 0,8,1,9 / 4,12,5,13 / 2,10,3,11 / 6,14,7,15 of a 16-code word:
// the activation's bytes are stored in that order, fold_perm). The scales are read from global
// one block ahead (16 bytes a row and block) and q computed in the lane.
//
// The activation: int8 per token and 1024-block (scale max|x| / 127 over the block, the
// producers' rounding rule), tiled as in wgmma_prefill.cuh with each 16-byte chunk permuted by
// fold_perm; scales [tile][block][128] fp32.
//
// y[m, n] = sum_b D[n, b] * sx[m, b] * sum_{k in b} (c[n, k] - 1) * q[n, g(k)] * xq[m, k]:
// against the exact formula, the weight scales carry a relative error of at most 0.5 / |q|
// (<= 0.8 % / 0.4 % for the block's largest group at L = 63 / 127), and the activation that of
// one int8 scale a 1024 block; the GPU tests bound the sum of both
// (tests/kernels/test_pq2_wgmma_prefill.py).
#pragma once

#include "wgmma_prefill.cuh"

namespace vllm_prism {
namespace wgmma_prefill {

constexpr int kBlockGroups = 8;  // 128-groups of a 1024 block
// A producer warpgroup (its first warp copies) and the two consumer warpgroups: 9 warps
// cannot hold more than 168 registers a thread (three warps of a sub-partition's 16K), so the
// producers hand theirs to the consumers (setmaxnreg).
constexpr int kFoldThreads = kConsumers + 128;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumers * kConsumerRegs <= 65536, "register file");
// The scales buffer is pq2_wgmma_fold_tiled_scales (wgmma_prefill_launch.h), whose 8 this is.
static_assert(kBlockGroups == 8, "pq2_wgmma_fold_tiled_scales");

// The int8 weights {-q, 0, q, 2q} of codes 0..3 as the bytes of one register.
__device__ __forceinline__ uint32_t fold_table(int q) {
  return (uint32_t(-q) & 0xFFu) | ((uint32_t(q) & 0xFFu) << 16) | ((uint32_t(2 * q) & 0xFFu) << 24);
}

// levels / max |d| of a block's 8 fp16 scales (0 where all are 0): q = rint(d * inv).
__device__ __forceinline__ float fold_inv(const uint4& raw, float levels) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
  float mx = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __half22float2(h[j]);
    mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  return mx > 0.f ? levels / mx : 0.f;
}

// The table of group j of the block.
__device__ __forceinline__ uint32_t fold_group_table(const uint4& raw, int j, float inv) {
  const uint32_t w = (j >> 1) == 0 ? raw.x : (j >> 1) == 1 ? raw.y : (j >> 1) == 2 ? raw.z : raw.w;
  const float dj = __half2float(__ushort_as_half(uint16_t(w >> ((j & 1) * 16))));
  return fold_table(__float2int_rn(dj * inv));
}

// The 8 fp16 scales of block b of a row (zeros past its groups), 16 bytes.
__device__ __forceinline__ uint4 load_block_scales(const uint16_t* row, int b, int groups) {
  if ((b + 1) * kBlockGroups <= groups) return *reinterpret_cast<const uint4*>(row + b * 8);
  uint32_t v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = b * 8 + 2 * j < groups ? row[b * 8 + 2 * j] : 0;
    const uint32_t hi = b * 8 + 2 * j + 1 < groups ? row[b * 8 + 2 * j + 1] : 0;
    v[j] = lo | (hi << 16);
  }
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// One group's A fragments (rows g and g + 8 of the lane) from the stage's codes.
__device__ __forceinline__ void fold_decode(const char* buf, int row_a, int sh, uint32_t t0,
                                            uint32_t t1, uint32_t (&a)[4][4]) {
  const uint4* codes = reinterpret_cast<const uint4*>(buf + kBBytes);
  const uint4 w0a = codes[row_a * 2], w0b = codes[row_a * 2 + 1];
  const uint4 w1a = codes[(row_a + 8) * 2], w1b = codes[(row_a + 8) * 2 + 1];
  const uint32_t r0w[8] = {w0a.x, w0a.y, w0a.z, w0a.w, w0b.x, w0b.y, w0b.z, w0b.w};
  const uint32_t r1w[8] = {w1a.x, w1a.y, w1a.z, w1a.w, w1b.x, w1b.y, w1b.z, w1b.w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    a[c][0] = __byte_perm(t0, 0, (r0w[2 * c] >> sh) & 0x3333u);
    a[c][1] = __byte_perm(t1, 0, (r1w[2 * c] >> sh) & 0x3333u);
    a[c][2] = __byte_perm(t0, 0, (r0w[2 * c + 1] >> sh) & 0x3333u);
    a[c][3] = __byte_perm(t1, 0, (r1w[2 * c + 1] >> sh) & 0x3333u);
  }
}

// Four MMAs of one group into d (the first of a block starting the sums), committed.
__device__ __forceinline__ void fold_mma(const char* buf, uint32_t (&a)[4][4], int32_t (&d)[64],
                                         bool first) {
  const uint64_t desc = b_desc(buf);
#pragma unroll
  for (int i = 0; i < 64; ++i) fence_reg(d[i]);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int c = 0; c < 4; ++c)
    wgmma_s8(d, a[c], desc + uint64_t((c * 256) >> 4), (c > 0 || !first) ? 1 : 0);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void fence_a(uint32_t (&a)[4][4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i) fence_reg(a[c][i]);
}

__global__ void __launch_bounds__(kFoldThreads, 1) fold_gemm_kernel(const Params p) {
  extern __shared__ __align__(1024) char smem[];
  uint64_t* full = init_stage_barriers(smem);
  uint64_t* empty = full + kStages;
  if (threadIdx.x >= kConsumers) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x < kConsumers + 32) produce(p, smem, full, empty, kBlockGroups);
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  const Lane l = consumer_lane(p);
  const int lane = l.lane, tq = l.tq, row_a = l.row_a;
  const int sh = (tq & 1) * 2 + (tq >> 1) * 16;
  const int blocks = (p.groups + kBlockGroups - 1) / kBlockGroups;
  const float levels = static_cast<float>(p.fold_levels);
  float acc[64];  // the fp32 sums and the warpgroup's int32 ones
  int32_t d[64];
  zero64(acc);
  zero64(d);
  uint32_t a[2][4][4];
  uint4 n0 = load_block_scales(l.s0, 0, p.groups), n1 = load_block_scales(l.s1, 0, p.groups);
  for (int b = 0; b < blocks; ++b) {
    const uint4 c0 = n0, c1 = n1;
    const float inv0 = fold_inv(c0, levels), inv1 = fold_inv(c1, levels);
    const float dw0 = l.ok0 && inv0 > 0.f ? 1.f / inv0 : 0.f;
    const float dw1 = l.ok1 && inv1 > 0.f ? 1.f / inv1 : 0.f;
    if (b + 1 < blocks) {
      n0 = load_block_scales(l.s0, b + 1, p.groups);
      n1 = load_block_scales(l.s1, b + 1, p.groups);
    }
    const int g0 = b * kBlockGroups;
    const int ng = min(kBlockGroups, p.groups - g0);
    // group j of the block into A buffer `cur`; the group before (in `prev`) released
    auto step = [&](int j, uint32_t (&cur)[4][4], uint32_t (&prev)[4][4]) {
      const int g = g0 + j, s = g % kStages;
      mbar_wait(&full[s], (g / kStages) & 1);
      const char* buf = smem + s * kStageBytes;
      fold_decode(buf, row_a, sh, fold_group_table(c0, j, inv0), fold_group_table(c1, j, inv1),
                  cur);
      fold_mma(buf, cur, d, j == 0);
      if (j > 0) {
        wgmma_wait<1>();
        fence_a(prev);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[(g - 1) % kStages]);
      }
    };
#pragma unroll 1
    for (int j = 0; j < ng; j += 2) {
      step(j, a[0], a[1]);
      if (j + 1 < ng) step(j + 1, a[1], a[0]);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) fence_reg(d[i]);
    fence_a(a[0]);
    fence_a(a[1]);
    const int gl = g0 + ng - 1;
    const float* sx = reinterpret_cast<const float*>(smem + (gl % kStages) * kStageBytes +
                                                     kBBytes + kABytes);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float2 sv = *reinterpret_cast<const float2*>(sx + 8 * j + 2 * tq);
      const float p00 = dw0 * sv.x, p01 = dw0 * sv.y, p10 = dw1 * sv.x, p11 = dw1 * sv.y;
      acc[4 * j + 0] += p00 * __int2float_rn(d[4 * j + 0]);
      acc[4 * j + 1] += p01 * __int2float_rn(d[4 * j + 1]);
      acc[4 * j + 2] += p10 * __int2float_rn(d[4 * j + 2]);
      acc[4 * j + 3] += p11 * __int2float_rn(d[4 * j + 3]);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[gl % kStages]);
  }
  store_tile(p, acc, row_a, tq);
}

// int8 per token and 1024-block into the fold layout. A CTA takes 8 tokens of a block, warp w
// its group w: lane 8j' + r holds token r's 16-value chunks j' and j' + 4 of the group; the
// groups' maxima meet in shared memory; the bytes of a chunk are written permuted by
// fold_perm.
template <typename T>
__global__ void __launch_bounds__(256) quantize_fold_kernel(const T* __restrict__ x, int64_t ldx,
                                                            int m, int k,
                                                            int8_t* __restrict__ xt,
                                                            float* __restrict__ sxt) {
  __shared__ float red[kBlockGroups][8];
  const int groups = k / 128, blocks = (groups + kBlockGroups - 1) / kBlockGroups;
  const int b = blockIdx.x % blocks, w = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31, r = lane & 7, jq = lane >> 3;
  const int tok = (blockIdx.x / blocks) * 8 + r;
  const int g = b * kBlockGroups + w, ng = min(kBlockGroups, groups - b * kBlockGroups);
  float v[2][16];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    load_chunk(x, ldx, w < ng ? tok : m, m, g * 128 + (jq + 4 * h) * 16, v[h]);
  float amax = group_amax(v);
  if (jq == 0) red[w][r] = amax;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kBlockGroups; ++j) amax = fmaxf(amax, red[j][r]);
  if (w >= ng) return;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  write_chunks<true>(xt + tiled_offset(tok, g * 128, groups) - (tok & 7) * 16, v, inv, r, jq);
  if (w == 0 && jq == 0) sxt[((int64_t(tok >> 7) * blocks + b) << 7) + (tok & 127)] = amax / 127.f;
}

template <typename T>
inline cudaError_t quantize_fold(const T* x, int64_t ldx, int m, int k, int8_t* xt, float* sxt,
                                 cudaStream_t stream) {
  const int m_pad = (m + 127) / 128 * 128;
  const int blocks = (k / 128 + kBlockGroups - 1) / kBlockGroups;
  quantize_fold_kernel<T><<<unsigned(m_pad / 8 * blocks), 256, 0, stream>>>(x, ldx, m, k, xt,
                                                                          sxt);
  return cudaGetLastError();
}

// Needs K % 128 == 0 and the buffers of quantize_fold.
inline cudaError_t fold_gemm(const Params& p, cudaStream_t stream) {
  return launch_gemm(fold_gemm_kernel, kFoldThreads, p, stream);
}

}  // namespace wgmma_prefill
}  // namespace vllm_prism
