// PQ2 linear for any M on int8 tensor cores: see mma_int8.cuh for the fragment decode and
// pq2_params.cuh for the formula. Torch-free (CI compiles it for sm_80 and sm_90 without a
// GPU); the torch op is in mma_int8_op.cu.
//
// A CTA computes 128 weight rows (8 warps x 16 rows, two n8 tiles each) for 16, 32 or 64
// activation rows (M <= 64: all of them; above: one 64-row tile per grid z), over a K range:
// all of K, or one split (the splits of a tile meet in a workspace, see reduce_split). K
// advances in stages of 256 (two 128-groups): the stage's code words (128 rows x 64 B), fp16
// scales, int8 activations and activation group scales/sums go to shared memory through a
// 4-deep cp.async pipeline. Per 32-wide chunk, each warp decodes its B fragments once (SHF +
// AND per four weights) and runs one mma.sync per 16-token m-tile and n8 tile; at each
// group's end the int32 sums are taken to fp32 exactly (magic-number add), offset by the
// activation sum and scaled. With programmatic dependent launch the weight loads of the first
// stages are issued before griddepcontrol.wait, so they overlap the kernel that produces the
// activation.
#include "mma_int8.cuh"

#include "pq2_device.cuh"

namespace vllm_prism {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileN = kPq2MmaTileN;    // rows per CTA
constexpr int kBlockK = kPq2MmaBlockK;  // K per stage: two 128-groups, eight 32-chunks
constexpr int kStages = 4;
constexpr int kWRowBytes = 80;          // 64 B of codes + 16 B pad: conflict-free uint4 reads
constexpr int kARowBytes = 272;         // 256 B of activations + 16 B pad: ldmatrix rows
constexpr int kWBytes = kTileN * kWRowBytes;
constexpr int kDBytes = kTileN * 4;     // two fp16 scales per row

template <int MT>
struct Stage {
  static constexpr int kTokens = 16 * MT;
  static constexpr int kABytes = kTokens * kARowBytes;
  static constexpr int kSBytes = kTokens * 8;  // two fp32 (or int32) per token
  static constexpr int kW = 0;
  static constexpr int kA = kW + kWBytes;
  static constexpr int kD = kA + kABytes;
  static constexpr int kSX = kD + kDBytes;
  static constexpr int kQS = kSX + kSBytes;
  static constexpr int kBytes = kQS + kSBytes;
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&a)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(smem_addr(p)));
}

// Code words (and their two fp16 scales) of stage `kb` for the CTA's rows; rows past N read
// row N - 1 (their results are not stored).
template <int MT>
__device__ __forceinline__ void load_weights(const Pq2LinearParams& p, char* st, int row0, int kb) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < (kTileN * 4) / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx >> 2, j = idx & 3;
    const int row = min(row0 + r, p.n - 1);
    const int32_t* src = p.codes + row * p.stride_c + kb * (kBlockK / 16) + 4 * j;
    cp_async16(st + Stage<MT>::kW + r * kWRowBytes + 16 * j, src);
  }
  if (tid < kTileN) {
    const int row = min(row0 + tid, p.n - 1);
    cp_async4(st + Stage<MT>::kD + 4 * tid, p.scales + row * p.stride_s + 2 * kb);
  }
}

// Activations of stage `kb` for tokens m_base.. (tokens past M read token M - 1) and their
// group scales/sums.
template <int MT>
__device__ __forceinline__ void load_activations(const Pq2LinearParams& p, char* st, int m_base,
                                                 int kb) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < MT; ++i) {  // 16 * MT tokens x 16 chunks of 16 B = MT * 256
    const int idx = tid + i * kThreads;
    const int tok = idx >> 4, j = idx & 15;
    const int src_tok = min(m_base + tok, p.m - 1);
    cp_async16(st + Stage<MT>::kA + tok * kARowBytes + 16 * j,
               p.xq + src_tok * p.stride_x + kb * kBlockK + 16 * j);
  }
  constexpr int kTokens = Stage<MT>::kTokens;
  if (tid < 2 * kTokens) {
    const int tok = tid % kTokens;
    const int src_tok = min(m_base + tok, p.m - 1);
    if (tid < kTokens) {
      cp_async8(st + Stage<MT>::kSX + 8 * tok, p.sx + src_tok * p.stride_g + 2 * kb);
    } else {
      cp_async8(st + Stage<MT>::kQS + 8 * tok, p.qsum + src_tok * p.stride_g + 2 * kb);
    }
  }
}

// K split: every CTA of a tile leaves its partial sums in the workspace; the last to arrive
// (a counter per tile, reset by that CTA for the next launch) adds all of them up in split
// order (deterministic) and goes on to store. Returns whether this CTA stores. Every thread of a CTA holds the same
// (m, n) positions in every split, so the partials are read back by the thread that wrote
// the matching ones.
template <int MT>
__device__ __forceinline__ bool reduce_split(const Pq2LinearParams& p, float (&acc)[MT][2][4]) {
  constexpr int kValues = MT * 8;
  __shared__ int is_last;
  const int tile = blockIdx.x + gridDim.x * blockIdx.z;
  const int64_t tiles = static_cast<int64_t>(gridDim.x) * gridDim.z;
  auto slot = [&](int s) {
    return p.workspace + ((s * tiles + tile) * kThreads + threadIdx.x) * kValues;
  };
  float* mine = slot(blockIdx.y);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      *reinterpret_cast<float4*>(mine + (i * 2 + j) * 4) =
          make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(p.counters + tile, 1) == p.split - 1;
  __syncthreads();
  if (!is_last) return false;
  __threadfence();
  fill(acc, 0.f);  // sum every split in order (its own too): the same result whichever is last
  for (int s = 0; s < p.split; ++s) {
    const float* other = slot(s);
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float4 o = __ldcg(reinterpret_cast<const float4*>(other + (i * 2 + j) * 4));
        acc[i][j][0] += o.x;
        acc[i][j][1] += o.y;
        acc[i][j][2] += o.z;
        acc[i][j][3] += o.w;
      }
  }
  if (threadIdx.x == 0) p.counters[tile] = 0;
  return true;
}

template <int MT>
__global__ void __launch_bounds__(kThreads)
    pq2_mma_int8_kernel(const __grid_constant__ Pq2LinearParams p) {
  extern __shared__ __align__(16) char smem[];
  if (p.pdl) pdl_launch_dependents();
  const int row0 = blockIdx.x * kTileN;
  const int m_base = blockIdx.z * Stage<MT>::kTokens;
  const int n_kb = p.k / kBlockK;
  const int per = (n_kb + p.split - 1) / p.split;
  const int kb_lo = blockIdx.y * per;
  const int kb_hi = min(n_kb, kb_lo + per);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  constexpr int kSB = Stage<MT>::kBytes;

  // Prologue: the first stages' weights before the wait (they do not depend on the
  // previous kernel), their activations after it.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (kb_lo + s < kb_hi) load_weights<MT>(p, smem + s * kSB, row0, kb_lo + s);
  }
  if (p.pdl) pdl_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (kb_lo + s < kb_hi) load_activations<MT>(p, smem + s * kSB, m_base, kb_lo + s);
    cp_async_commit();
  }

  float acc[MT][2][4];
  fill(acc, 0.f);

  for (int kb = kb_lo; kb < kb_hi; ++kb) {
    const int it = kb - kb_lo;
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int nk = kb + kStages - 1;
    if (nk < kb_hi) {
      char* nst = smem + ((it + kStages - 1) % kStages) * kSB;
      load_weights<MT>(p, nst, row0, nk);
      load_activations<MT>(p, nst, m_base, nk);
    }
    cp_async_commit();

    const char* st = smem + (it % kStages) * kSB;
    const char* ws = st + Stage<MT>::kW;
    const char* as = st + Stage<MT>::kA;
    const __half* ds = reinterpret_cast<const __half*>(st + Stage<MT>::kD);
    const float* sxs = reinterpret_cast<const float*>(st + Stage<MT>::kSX);
    const int32_t* qss = reinterpret_cast<const int32_t*>(st + Stage<MT>::kQS);
#pragma unroll
    for (int grp = 0; grp < 2; ++grp) {
      int32_t isum[MT][2][4];
      fill(isum, 0);
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {  // 64 k: one uint4 of words per row
        const int p64 = 2 * grp + pair;
        uint32_t b[2][2][2];  // [n8 tile][chunk of the pair][reg]
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int r = 16 * warp + 8 * j + g;
          const uint4 w = *reinterpret_cast<const uint4*>(ws + r * kWRowBytes + 16 * p64);
          const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            b[j][h][0] = (words[2 * h] >> (2 * t)) & 0x03030303u;
            b[j][h][1] = (words[2 * h + 1] >> (2 * t)) & 0x03030303u;
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = 2 * p64 + h;  // 32-chunk within the stage
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            const int mi = lane >> 3, r8 = lane & 7;
            const int tok = 16 * i + r8 + 8 * (mi & 1);
            uint32_t a[4];
            ldmatrix_x4(a, as + tok * kARowBytes + 32 * c + 16 * (mi >> 1));
#pragma unroll
            for (int j = 0; j < 2; ++j) mma_s8(isum[i][j], a, b[j][h][0], b[j][h][1]);
          }
        }
      }
      // Group end: y += d[n] * sx[m] * (sum - qsum[m]) for this thread's 4 (m, n) pairs.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int r = 16 * warp + 8 * j + 2 * t;
        const float d0 = __half2float(ds[2 * r + grp]);
        const float d1 = __half2float(ds[2 * (r + 1) + grp]);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const int m0 = 16 * i + g, m1 = m0 + 8;
          const float s0 = sxs[2 * m0 + grp], s1 = sxs[2 * m1 + grp];
          const int32_t q0 = qss[2 * m0 + grp], q1 = qss[2 * m1 + grp];
          acc[i][j][0] += exact_float(isum[i][j][0] - q0) * (d0 * s0);
          acc[i][j][1] += exact_float(isum[i][j][1] - q0) * (d1 * s0);
          acc[i][j][2] += exact_float(isum[i][j][2] - q1) * (d0 * s1);
          acc[i][j][3] += exact_float(isum[i][j][3] - q1) * (d1 * s1);
        }
      }
    }
  }
  cp_async_wait<0>();
  if (p.split > 1 && !reduce_split(p, acc)) return;  // another split stores this tile

  const bool add_bias = p.bias != nullptr;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int n0 = row0 + 16 * warp + 8 * j + 2 * t;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int n = n0 + (v & 1);
      if (n >= p.n) continue;
      const float bias = add_bias ? load_as_float(p.bias, n, p.bias_dtype) : 0.f;
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int m = m_base + 16 * i + g + 8 * (v >> 1);
        if (m < p.m) store_out(p, static_cast<int64_t>(m) * p.stride_o + n, acc[i][j][v] + bias);
      }
    }
  }
}

template <int MT>
cudaError_t launch(const Pq2LinearParams& p, cudaStream_t stream) {
  const int smem = kStages * Stage<MT>::kBytes;
  cudaError_t err = cudaFuncSetAttribute(pq2_mma_int8_kernel<MT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.n + kTileN - 1) / kTileN, p.split,
                     (p.m + Stage<MT>::kTokens - 1) / Stage<MT>::kTokens);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  set_pdl(cfg, attr, p.pdl);
  return cudaLaunchKernelEx(&cfg, pq2_mma_int8_kernel<MT>, p);
}

}  // namespace

int pq2_mma_int8_default_split(int m, int n, int k, int sm_count) {
  const int m_tiles = m <= 64 ? 1 : (m + 63) / 64;
  const int ctas = (n + kTileN - 1) / kTileN * m_tiles;
  const int n_kb = k / kBlockK;
  int split = (2 * sm_count + ctas - 1) / ctas;
  split = split < 1 ? 1 : split;
  return split > n_kb ? n_kb : split;
}

namespace {

int m_tile_count(int m) { return m <= 16 ? 1 : (m <= 32 ? 2 : 4); }

}  // namespace

int64_t pq2_mma_int8_tiles(int m, int n) {
  const int tokens = 16 * m_tile_count(m);
  return static_cast<int64_t>((n + kTileN - 1) / kTileN) * ((m + tokens - 1) / tokens);
}

int64_t pq2_mma_int8_workspace_floats(int m, int n, int split) {
  return split <= 1 ? 0 : split * pq2_mma_int8_tiles(m, n) * kThreads * 8 * m_tile_count(m);
}

cudaError_t pq2_mma_int8_launch(const Pq2LinearParams& p, cudaStream_t stream) {
  if (p.m <= 0 || p.n <= 0) return cudaSuccess;
  if (p.k % kBlockK != 0 || p.split < 1 || (p.m + 63) / 64 > 65535) return cudaErrorInvalidValue;
  if (p.split > 1 && (p.workspace == nullptr || p.counters == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.m <= 16) return launch<1>(p, stream);
  // 64-token tiles need 114 KiB: where a block may not have that (sm_86 / sm_89: 99 KiB),
  // 32-token tiles (78 KiB) take every M, two grid rows per 64 tokens (the workspace sized
  // for 64-token tiles holds them: half the values per tile, at most twice the tiles).
  if (p.m <= 32 || kStages * Stage<4>::kBytes > max_dynamic_smem_per_block()) {
    return launch<2>(p, stream);
  }
  return launch<4>(p, stream);
}

}  // namespace vllm_prism
