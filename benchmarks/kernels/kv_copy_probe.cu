// How fast the INT8 KV cache's rows reach shared memory in each copy pattern of the CUDA
// attention kernels, with no attention computed: the memory side's ceiling of a kernel's
// structure, outside torch.
//
// The cache is vLLM's int8_per_token_head NHD layout for head size 256 and 4 KV heads (a slot:
// 4 rows of 520 bytes side by side, 2080 bytes; blocks of 16 slots, random block table), in
// copies that together exceed three times the L2 (every launch of a timed graph reads DRAM).
// One CTA a multiprocessor; its producer thread fills a ring of stage buffers that two
// consumer warps (segments 2z and 2z + 1, the even and odd stages, as in
// csrc/attention/int8_verify_wgmma.cu) wait for and hand back, each after `consume_ns` of
// spinning (0: the copies alone; more: a consumer that computes that long a stage). Patterns:
//   tma_head   the verification kernel's (wgmma_tma): a CTA per (KV head, segment pair), a stage
//              4 TMA boxes of one head's 16 slots x 544 bytes (the row from its 16-byte
//              boundary), 174 KB of ring (5 stages), a stage issued once the one 3 before landed
//   tma_slots  a CTA per segment pair over every head, a stage one 16-slot tile as 2 TMA boxes
//              of 2 heads (1040 bytes a slot), the same ring and rule
//   bulk_tile  the same stages as one 33,280-byte bulk copy each (a block is contiguous)
// and, for the same bytes in one launch, the streaming-read probe of pq2_sweep_common.cuh.
// A check launch first compares a word of every copied tile with the cache (mismatches
// counted; non-zero fails the run).
//
// Build and run on the GPU machine (scripts/gpu-session.sh kv-probe does both):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Icsrc \
//        benchmarks/kernels/kv_copy_probe.cu -o probe
//   ./probe 32768,131072 0,1000,2000 > probe.jsonl
// Output: one JSON object per line (context, pattern, consume_ns, us, useful GB/s and their
// fraction of the sustained read bandwidth, the same-size probe's fraction), then a summary
// line per context. Useful bytes: 4 x 520 a slot (bench_attention.py's bw_frac numerator).
#include "async_pipeline.cuh"
#include "attention/cache_rows_map.h"
#include "pq2_sweep_common.cuh"

using namespace pq2_sweep;
using vllm_prism::mbar_arrive;
using vllm_prism::mbar_expect_tx;
using vllm_prism::mbar_init;
using vllm_prism::mbar_wait;

namespace {

constexpr int kHeads = 4;
constexpr int kRow = 520;  // 2 x 256 + 8
constexpr int kSlotBytes = kHeads * kRow;  // 2080
constexpr int kSlots = 16;  // block size = a tile
constexpr int kTileBytes = kSlots * kSlotBytes;  // 33,280
constexpr int kSRow = 544;  // a head row from its 16-byte boundary (the kernel's kSRow)
constexpr int kHeadTiles = 4;  // tma_head: tiles a stage (the MMA's 64 rows)
constexpr int kRing = 5;
constexpr int kLag = kRing - 2;
constexpr int kHalfBox = 2 * kRow / 8;  // tma_slots: 2 heads of 8-byte elements, 130

enum Pattern { kTmaHead = 0, kTmaSlots = 1, kBulkTile = 2 };
const char* const kPatternNames[] = {"tma_head", "tma_slots", "bulk_tile"};

__host__ __device__ constexpr int stage_bytes(int pattern) {
  return pattern == kTmaHead ? kHeadTiles * kSlots * kSRow : kTileBytes;
}
__host__ __device__ constexpr int tiles_a_stage(int pattern) { return pattern == kTmaHead ? kHeadTiles : 1; }

struct ProbeParams {
  const uint8_t* cache;  // this launch's copy
  const int32_t* block_table;  // [n_tiles]: the block of tile t (block size 16)
  int n_tiles;
  int tiles_per_seg;  // a segment's tiles
  int segs;  // segments a head (tma_head) or in all (the others); 2 a CTA
  long long consume_cycles;
  unsigned* errors;  // the check launch: mismatching tiles; nullptr when timing
  unsigned* sink;  // the stages' XOR, stored only if it is a value random data never gives
};

// the (c0, c1, c2) of the first 16-byte boundary at or before head h's row of block `blk`
__device__ __forceinline__ int head_c0(int h) { return (h * kRow) / 16 * 2; }

template <int P>
__global__ void __launch_bounds__(96, 1)
    kv_copy_probe(const __grid_constant__ CUtensorMap map, const ProbeParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kRing * stage_bytes(P));
  uint64_t* empty = full + kRing;
  constexpr int T = tiles_a_stage(P);
  const int head = P == kTmaHead ? blockIdx.x : 0;
  const int pair = P == kTmaHead ? blockIdx.y : blockIdx.x;
  const int stages_a_seg = (p.tiles_per_seg + T - 1) / T;
  const int n_stages = 2 * stages_a_seg;  // stage k: segment 2 pair + k % 2, its stage k / 2
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  auto first_tile = [&](int k) {
    return (2 * pair + (k & 1)) * p.tiles_per_seg + (k >> 1) * T;
  };
  auto seg_end = [&](int k) {
    return min((2 * pair + (k & 1) + 1) * p.tiles_per_seg, p.n_tiles);
  };
  if (threadIdx.x == 0) {
    for (int b = 0; b < kRing; ++b) {
      mbar_init(&full[b], 1);
      mbar_init(&empty[b], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (warp == 2) {  // the producer
    if (lane != 0) return;
    for (int k = 0; k < n_stages; ++k) {
      const int buf = k % kRing;
      if (k >= kRing) mbar_wait(&empty[buf], ((k / kRing) + 1) & 1);
      if (k >= kLag) mbar_wait(&full[(k - kLag) % kRing], ((k - kLag) / kRing) & 1);
      const int t0 = first_tile(k);
      const int n = max(0, min(T, seg_end(k) - t0));
      uint8_t* dst = smem + buf * stage_bytes(P);
      if (n == 0) {
        mbar_arrive(&full[buf]);
        continue;
      }
      if (P == kTmaHead) {
        mbar_expect_tx(&full[buf], n * kSlots * kSRow);
        for (int i = 0; i < n; ++i)
          vllm_prism::tma_load_3d(dst + i * kSlots * kSRow, &map, head_c0(head), 0,
                                  p.block_table[t0 + i], &full[buf]);
      } else if (P == kTmaSlots) {
        mbar_expect_tx(&full[buf], kTileBytes);
        for (int i = 0; i < 2; ++i)
          vllm_prism::tma_load_3d(dst + i * kSlots * 2 * kRow, &map, i * kHalfBox, 0,
                                  p.block_table[t0], &full[buf]);
      } else {
        mbar_expect_tx(&full[buf], kTileBytes);
        vllm_prism::bulk_copy(dst, p.cache + static_cast<int64_t>(p.block_table[t0]) * kTileBytes,
                              kTileBytes, &full[buf]);
      }
    }
    return;
  }
  // consumer `warp` (0 or 1): the stages k = 2 j + warp
  uint32_t acc = 0;
  for (int k = warp; k < n_stages; k += 2) {
    const int buf = k % kRing;
    mbar_wait(&full[buf], (k / kRing) & 1);
    const uint8_t* src = smem + buf * stage_bytes(P);
    acc ^= reinterpret_cast<const uint32_t*>(src)[lane];
    const int t0 = first_tile(k);
    const int n = max(0, min(T, seg_end(k) - t0));
    // the check launch: the first 8 bytes of slot 5's row of every (tile, head) copied
    constexpr int H = P == kTmaHead ? 1 : kHeads;  // heads a tile of the stage holds
    if (p.errors != nullptr && lane < n * H) {
      const int i = lane / H;
      const int h = P == kTmaHead ? head : lane % H;
      const int64_t blk = p.block_table[t0 + i];
      const int64_t g_off = blk * kTileBytes + 5 * kSlotBytes + h * kRow;
      int s_off;
      if (P == kTmaHead)  // [tile][slot][544 bytes from the 16-byte boundary]
        s_off = i * kSlots * kSRow + 5 * kSRow + (h * kRow - head_c0(h) * 8);
      else if (P == kTmaSlots)  // two boxes of 2 heads: [box][slot][1040 bytes]
        s_off = (h / 2) * kSlots * 2 * kRow + 5 * 2 * kRow + (h % 2) * kRow;
      else  // the block as it is
        s_off = 5 * kSlotBytes + h * kRow;
      const uint64_t want = *reinterpret_cast<const uint64_t*>(p.cache + g_off);
      uint64_t got;
      memcpy(&got, src + s_off, 8);
      if (got != want) atomicAdd(p.errors, 1u);
    }
    if (p.consume_cycles > 0) {
      const long long t_end = clock64() + p.consume_cycles;
      while (clock64() < t_end) {
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[buf]);
  }
  // keeps each stage's shared-memory read (a value random data never gives)
  if (acc == 0x9E3779B9u) *p.sink = acc;
}

// The cache's rows in boxes of `box0` 8-byte elements x 16 slots x 1 block (the
// verification kernel's map, csrc/attention/cache_rows_map.h).
CUtensorMap rows_map(const uint8_t* cache, int64_t blocks, int box0) {
  CUtensorMap map;
  if (!vllm_prism::encode_cache_rows_map(&map, cache, kSlotBytes, kSlots, blocks, kTileBytes,
                                         box0, kSlots)) {
    std::fprintf(stderr, "no tensor map over the cache (box %d): a driver without "
                         "cuTensorMapEncodeTiled, or a geometry it refuses\n", box0);
    std::exit(1);
  }
  return map;
}

template <int P>
cudaError_t launch(const CUtensorMap& map, const ProbeParams& p, int ctas, cudaStream_t s) {
  constexpr int smem = kRing * stage_bytes(P) + 2 * kRing * 8;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kv_copy_probe<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return attr;
  const dim3 grid = P == kTmaHead ? dim3(kHeads, ctas / kHeads) : dim3(ctas);
  kv_copy_probe<P><<<grid, 96, smem, s>>>(map, p);
  return cudaGetLastError();
}

cudaError_t launch_pattern(int pattern, const CUtensorMap& map, const ProbeParams& p, int ctas,
                           cudaStream_t s) {
  switch (pattern) {
    case kTmaHead: return launch<kTmaHead>(map, p, ctas, s);
    case kTmaSlots: return launch<kTmaSlots>(map, p, ctas, s);
    default: return launch<kBulkTile>(map, p, ctas, s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int> contexts = parse_ints(argc > 1 ? argv[1] : "32768,131072");
  const std::vector<int> consume_ns = parse_ints(argc > 2 ? argv[2] : "0,1000,2000");
  SweepDevice dev;
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  unsigned* errors;
  CHECK(cudaMalloc(&errors, 4));
  for (const int ctx : contexts) {
    const int n_tiles = (ctx + kSlots - 1) / kSlots;
    const int64_t bytes = static_cast<int64_t>(n_tiles) * kTileBytes;
    const int copies = static_cast<int>(std::max<int64_t>(2, 3 * kL2Bytes / bytes + 1));
    std::vector<uint8_t*> caches(copies);
    std::vector<CUtensorMap> head_maps(copies), slot_maps(copies);
    for (int c = 0; c < copies; ++c) {
      CHECK(cudaMalloc(&caches[c], bytes));
      fill_words<<<4 * dev.sms, 256, 0, dev.s>>>(reinterpret_cast<uint32_t*>(caches[c]),
                                                 bytes / 4, 11 + c);
      head_maps[c] = rows_map(caches[c], n_tiles, kSRow / 8);
      slot_maps[c] = rows_map(caches[c], n_tiles, kHalfBox);
    }
    // a random block order, as a paged cache's
    const std::vector<int32_t> order = shuffled_blocks(n_tiles);
    int32_t* table;
    CHECK(cudaMalloc(&table, n_tiles * 4));
    CHECK(cudaMemcpy(table, order.data(), n_tiles * 4, cudaMemcpyHostToDevice));
    const double probe_us = time_graph(
        2 * copies,
        [&](int i) {
          read_probe<<<dev.sms * 8, 512, 0, dev.s>>>(
              reinterpret_cast<const uint4*>(caches[i % copies]), bytes / 16, dev.sink);
          return cudaGetLastError();
        },
        dev.s);
    double best[3] = {0, 0, 0};
    for (int pattern = kTmaHead; pattern <= kBulkTile; ++pattern) {
      // one CTA a multiprocessor: tma_head's CTAs by head, so a multiple of the heads
      const int ctas = pattern == kTmaHead ? dev.sms / kHeads * kHeads : dev.sms;
      const int segs = pattern == kTmaHead ? 2 * (ctas / kHeads) : 2 * ctas;
      const int tiles_per_seg = (n_tiles + segs - 1) / segs;
      for (const int ns : consume_ns) {
        ProbeParams p{};
        p.block_table = table;
        p.sink = dev.sink;
        p.n_tiles = n_tiles;
        p.tiles_per_seg = tiles_per_seg;
        p.segs = segs;
        p.consume_cycles = static_cast<long long>(ns) * clock_khz / 1000000;
        auto map_of = [&](int c) -> const CUtensorMap& {
          return pattern == kTmaHead ? head_maps[c] : slot_maps[c];
        };
        // the check launch
        CHECK(cudaMemsetAsync(errors, 0, 4, dev.s));
        p.cache = caches[0];
        p.errors = errors;
        CHECK(launch_pattern(pattern, map_of(0), p, ctas, dev.s));
        unsigned bad = 0;
        CHECK(cudaMemcpyAsync(&bad, errors, 4, cudaMemcpyDeviceToHost, dev.s));
        CHECK(cudaStreamSynchronize(dev.s));
        if (bad != 0) {
          std::fprintf(stderr, "%s at context %d: %u tiles copied wrong\n",
                       kPatternNames[pattern], ctx, bad);
          return 1;
        }
        p.errors = nullptr;
        const double us = time_graph(
            2 * copies,
            [&](int i) {
              ProbeParams q = p;
              q.cache = caches[i % copies];
              return launch_pattern(pattern, map_of(i % copies), q, ctas, dev.s);
            },
            dev.s);
        const double gbps = bytes / us / 1e3;
        if (ns == 0) best[pattern] = gbps;
        std::printf("{\"context\": %d, \"pattern\": \"%s\", \"consume_ns\": %d, \"ctas\": %d, "
                    "\"stages_in_flight\": %d, \"us\": %.2f, \"gbps\": %.0f, \"frac\": %.3f, "
                    "\"vs_probe\": %.3f, \"probe_us\": %.2f}\n",
                    ctx, kPatternNames[pattern], ns, ctas, kLag, us, gbps,
                    gbps / dev.read_gbps, probe_us / us, probe_us);
        std::fflush(stdout);
      }
    }
    std::printf("{\"summary\": true, \"context\": %d, \"bytes\": %lld, \"copies\": %d, "
                "\"probe_frac\": %.3f, \"tma_head_frac\": %.3f, \"tma_slots_frac\": %.3f, "
                "\"bulk_tile_frac\": %.3f}\n",
                ctx, static_cast<long long>(bytes), copies, bytes / probe_us / 1e3 / dev.read_gbps,
                best[kTmaHead] / dev.read_gbps, best[kTmaSlots] / dev.read_gbps,
                best[kBulkTile] / dev.read_gbps);
    std::fflush(stdout);
    CHECK(cudaFree(table));
    for (uint8_t* c : caches) CHECK(cudaFree(c));
  }
  CHECK(cudaFree(errors));
  return 0;
}
