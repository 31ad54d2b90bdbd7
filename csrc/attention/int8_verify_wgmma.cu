// Split-KV verification attention over the paged INT8 cache on Hopper's warpgroup MMA (sm_90a;
// compiled apart by CMakeLists.txt's prism_sm90a object, launched by the torch op only on
// compute capability 9.0: VLLM_PRISM_ATTN_VERIFY_FORM, "auto" picks it). The same
// call as int8_verify.cu (parameters, segments, partials, PDL; the grid is half the segments),
// another inner loop:
//
//   S^T [64 slots x 8NT columns] = K . Q^T     16 (hd 256) wgmma.m64n{8NT}k16, K from registers
//   O^T [hd x 8NT columns]      += V^T . P^T   hd / 64 m-blocks x 4 k-steps of the same MMA,
//                                              V^T from registers
//
// One CTA = two consumer warpgroups and a producer warpgroup whose first warp copies (384
// threads, one CTA a multiprocessor): the producer copies the stages (4 16-slot tiles, the
// MMA's 64 rows) of two segments of the split into a ring of kRing stage buffers (by cp.async,
// a lane two rows; or, with a tensor map over the cache, WgmmaParams::rows, a TMA box a tile:
// VLLM_PRISM_ATTN_VERIFY_FORM=wgmma_tma, 2026-12-05; its boxes land in any order, so it
// issues a stage only once the stage kTmaLag before has landed: produce_tma), consumer
// warpgroup c computes segment 2 blockIdx.z + c (its stages are the even / odd ones of the
// ring's order) and writes that segment's partial straight from its registers (write_column).
// The ring's full and empty mbarriers are the only synchronisation between the producer and a
// consumer, a consumer's own steps are ordered by its named barrier (128 threads), so neither
// consumer waits for a copy issue or for the other (FlashAttention-3's producer / consumer
// split; the form with one warpgroup that copied its own stages behind CTA barriers, the
// thirty-second session's, spent about a sixth of its stall samples on the copies' issue and
// the block-table reads: attention_h200_notes.md, thirty-sixth session). Each int8 K and V
// element becomes an fp16 operand once, in the registers of the consumer warp whose rows it
// is; Q^T (once a CTA, shared by both consumers) and P^T (once a stage, a buffer a consumer)
// are the MMAs' B operands in shared memory, K-major core matrices without swizzle (8 columns
// x 16 bytes a core matrix, written by the threads, so each write is followed by
// fence.proxy.async before the barrier that publishes it). A consumer's stage:
//   1. the stage's rows are in (its full mbarrier); the consumer's barrier;
//   2. S^T: the warp's K fragments (rows g, g + 8 of its tile in the decode kernel's slot
//      order; a lane's 8 bytes at 32 kk + 8 t are k-steps 2 kk and 2 kk + 1, so Q^T is stored
//      in that permuted dimension order), the MMAs, wait;
//   3. K scales, the causal mask, each warp's column maxima to shared memory; barrier;
//   4. the columns' new maxima (every thread computes those of its own columns from the four
//      tiles' values: S^T and O^T hold the same columns in a lane), the accumulator's factors,
//      P (times the slot's V scale over the running V-scale maximum) transposed 8x8 into P^T,
//      whose K index is the S^T row: so V^T's k positions are the slots of those rows;
//      barrier;
//   5. O^T: the warp's V^T fragments (hd 256: output row 16w + g + 8h of m-block b is
//      dimension 4 (16w + g + 8h) + b, so one 32-bit load of a slot feeds the four m-blocks;
//      hd 128: dimension 4 (8w + g) + 2b + h); the stage buffer goes back to the producer (its
//      empty mbarrier); the MMAs, wait.
// Three barriers a stage as the exact form of int8_verify.cu, two with its lazy maxima
// (p.lazy_max, LM: from the second stage on P against the running maxima as they stand, one
// barrier that publishes P^T and ORs the lanes' verdicts, the stage redone exactly where a
// score passes its maximum by 2^8 or a V scale the running maximum by 64x). The instructions
// a stage are the point: 16 + 16 MMA instructions a warp where the mma.sync form issues 160 a
// tile and builds K twice (attention_h200_notes.md, tenth session). Head sizes 128 and 256,
// exact Q.K.
// scripts/emulate_verify_wgmma.py runs this index mapping lane by lane on the CPU against a
// float reference: a change to it goes there too, and is checked there before a GPU.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "../async_pipeline.cuh"
#include "attn_trace.cuh"
#include "cache_rows_map.h"
#include "int8_attention.cuh"
#include "int8_tile.cuh"
#include "int8_verify_common.cuh"
#include "wgmma_rs.cuh"

namespace vllm_prism {
namespace {

using namespace attn;

constexpr int kSlots = kTileSlots;
constexpr int kTiles = 4;  // a stage: 4 tiles, the MMA's 64 rows
constexpr int kStageSlots = kSlots * kTiles;
constexpr int kConsumers = 2;  // warpgroups 0 and 1
constexpr int kGroupThreads = 128;  // a warpgroup
constexpr int kConsumerThreads = kConsumers * kGroupThreads;
// and the producer warpgroup, whose first warp (warp 8) copies: 9 warps cannot hold more than
// 168 registers a thread (three warps of a sub-partition's 16K), so the producers hand theirs
// to the consumers (setmaxnreg), as csrc/pq2/wgmma_fold.cuh's. setmaxnreg.inc waits until the
// CTA's pool has the registers, so what the consumers gain must not pass what the producers
// give back from the launch's 168 a thread (else it waits forever).
constexpr int kThreads = kConsumerThreads + kGroupThreads;
constexpr int kLaunchRegs = 168;  // 65536 / 384, in steps of 8: ptxas's count for the kernel
constexpr int kProducerRegs = 56;
constexpr int kConsumerRegs = 224;
static_assert(kGroupThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                  kThreads * kLaunchRegs,
              "the consumers' registers come from the producers'");

// named barriers (0 is __syncthreads): both consumers (Q^T), then one a consumer
constexpr int kBarQuery = 1;
constexpr int kBarConsumer = 2;

// The CTA's timeline for benchmarks/kernels/verify_trace.cu (attn_trace.cuh: compiled in only
// there), kTraceStride words:
//   0 kernel entry (thread 0), 1 its %globaltimer (ns), 2 + c consumer c starts its loop
//   (Q^T staged), 4 + c consumer c has written its output, 6 the %globaltimer then of
//   consumer 0 (slots 1 and 6 give the clock's rate and line the CTAs up), 7 the
//   multiprocessor (%smid);
//   kTraceStage + (c kTraceMaxStages + st) kTraceSteps + e consumer c's stage st, event e:
//   0 waits for the stage, 1 the stage is in, 2 S^T is done, 3 P^T is published, 4 O^T done;
//   kTraceProd + 2 k (+ 1) the producer before the empty wait of the ring's stage k (its
//   copies issued: after the lag wait with TMA boxes, before the copies with cp.async).
constexpr int kTraceMaxStages = 64;  // a consumer's stages traced (more: not recorded)
constexpr int kTraceSteps = 5;
constexpr int kTraceStage = 8;
constexpr int kTraceProd = kTraceStage + kConsumers * kTraceMaxStages * kTraceSteps;
constexpr int kTraceStride = kTraceProd + 2 * kConsumers * kTraceMaxStages;

__device__ __forceinline__ void trace_at(bool who, int slot, bool timer = false) {
  attn_trace::at<kTraceStride>(who, slot, timer);
}
// consumer c's stage st, event e (past kTraceMaxStages: nothing)
__device__ __forceinline__ void trace_stage(bool who, int c, int st, int e) {
  trace_at(who && st < kTraceMaxStages,
           kTraceStage + (c * kTraceMaxStages + st) * kTraceSteps + e);
}

template <int HD, int NT>
struct WShape {
  static constexpr int kN = 8 * NT;        // columns: the MMA's N
  static constexpr int kKSteps = HD / 16;  // S^T
  static constexpr int kMBlocks = HD / 64;  // O^T
  static constexpr int kRow = 2 * HD + 8;  // bytes of one (slot, head) row in the cache
  // shared rows as int8_verify.cu's: words = 8 mod 32, room for a row 8 bytes in
  static constexpr int kSRow = 4 * (((kRow / 4 - 8 + 31) / 32) * 32 + 8);
  static constexpr int kStageBytes = kStageSlots * kSRow;
  static constexpr int kRing = HD == 256 ? 5 : 8;  // stage buffers (174 / 147 KB)
  // the TMA producer issues stage k once stage k - kTmaLag has landed (produce_tma): the
  // largest lag at which a consumer's parity wait cannot pass on a buffer's previous round
  static constexpr int kTmaLag = kRing - 2;
  static constexpr int kQSbo = 16 * HD;  // Q^T: bytes between 8-column groups (HD / 8 cores)
  static constexpr int kPSbo = 16 * kStageSlots;  // P^T: the same over a stage's 64 slots
  static constexpr int kPBytes = kN * kStageSlots * 2;  // a consumer's P^T
  static constexpr int kRedFloats = kTiles * kN;  // a consumer's fp32 [warp][column]
  static constexpr int kQOff = kRing * kStageBytes;
  static constexpr int kPOff = kQOff + kN * HD * 2;
  static constexpr int kRedOff = kPOff + kConsumers * kPBytes;
  static constexpr int kBarOff = kRedOff + kConsumers * kRedFloats * 4;  // full, then empty
  static constexpr int kSmem = kBarOff + 2 * kRing * 8;
  static_assert(HD == 128 || HD == 256, "head sizes 128 and 256");
  static_assert(kSRow >= kRow + 8 && (kSRow / 4) % 32 == 8 && kSRow % 16 == 0, "row layout");
  static_assert(kStageBytes % 128 == 0 && kQOff % 128 == 0 && kPOff % 128 == 0 &&
                kPBytes % 128 == 0 && kBarOff % 8 == 0, "alignment");
  static_assert(kSmem <= 227 * 1024, "shared memory of one CTA");
};

// Q^T into shared memory as the S^T MMAs' B operand: column c = token * group + head (zero past
// the request's columns), scaled by qk_scale, fp16. Dimension 32 kk + 8 t + j is k index
// 32 kk + 8 (j / 2) + 2 t + j % 2 (the order of the K fragments, above); element (c, k) at byte
// (c / 8) kQSbo + (k / 8) 128 + (c % 8) 16 + (k % 8) 2. With kAllLoads a thread issues all its
// 16-byte loads before it converts and stores any (else one load in flight at a time: they
// were a tenth of the stall samples at 32K, Nsight Compute, 2026-12-06); the kernel asks for
// it in its lazy form only, since the exact form at head size 256 and 5 n-tiles spills 8
// bytes with it.
template <int HD, int NT, bool kAllLoads>
__device__ __forceinline__ void stage_query_t(const Int8AttnParams& p, int kvh, int q_start,
                                              int n_cols, uint8_t* qs) {
  using S = WShape<HD, NT>;
  constexpr int kChunks = HD / 8;
  constexpr int kItems = S::kN * kChunks;
  constexpr int kIters = (kItems + kConsumerThreads - 1) / kConsumerThreads;
  // the query's 16 bytes of item i (c, d), zeros past the request's columns
  auto load = [&](int i) {
    const int c = i / kChunks;
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);
    if (i < kItems && c < n_cols) {
      const int tq = c / p.group;
      const int hq = kvh * p.group + (c - tq * p.group);
      const int64_t elem = static_cast<int64_t>(q_start + tq) * p.stride_qt +
                           static_cast<int64_t>(hq) * p.stride_qh + (i - c * kChunks) * 8;
      raw = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(p.q) + elem * 2);
    }
    return raw;
  };
  auto store = [&](int i, const uint4& raw) {
    const int c = i / kChunks;
    const int d = (i - c * kChunks) * 8;
    float v[8];
    q8_f32(raw, p.q_dtype, p.qk_scale, v);  // zeros stay zeros
    const int kk = d / 32, t = (d % 32) / 8;
    uint8_t* dst = qs + (c >> 3) * S::kQSbo + (c & 7) * 16 + 4 * t + 4 * kk * 128;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<uint32_t*>(dst + j * 128) = pack_f16x2(v[2 * j], v[2 * j + 1]);
  };
  if constexpr (kAllLoads) {
    uint4 raw[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) raw[it] = load(threadIdx.x + it * kConsumerThreads);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int i = threadIdx.x + it * kConsumerThreads;
      if (i < kItems) store(i, raw[it]);
    }
  } else {
    for (int i = threadIdx.x; i < kItems; i += kConsumerThreads) store(i, load(i));
  }
}

// Four fp16 pairs of dimension bytes from two slots' V words (already ^ 0x80): pair j holds byte
// j of w_a (low half, the first slot) and of w_b.
__device__ __forceinline__ void v_pairs(uint32_t w_a, uint32_t w_b, uint32_t k64,
                                        uint32_t (&h)[4]) {
  const uint32_t lo = __byte_perm(w_a, w_b, 0x5140), hi = __byte_perm(w_a, w_b, 0x7362);
  h[0] = f16x2_sel<0x4140>(lo, k64);
  h[1] = f16x2_sel<0x4342>(lo, k64);
  h[2] = f16x2_sel<0x4140>(hi, k64);
  h[3] = f16x2_sel<0x4342>(hi, k64);
}

// The kernel's parameters: the call's, and where the cache's layout allows it (tma 1) its rows as
// a TMA tensor map: elements of 8 bytes, dimension 0 a slot's heads side by side (stride_cn / 8
// elements), 1 the block's slots, 2 the blocks; a box is one head's 16 slots of a tile, kSRow
// bytes a row from the 16-byte boundary at or before the head's row (its row, the neighbours'
// bytes around it, or zeros past the last head).
struct WgmmaParams {
  CUtensorMap rows;
  Int8AttnParams p;
  int tma;
};

// The producer warp's loop: the stages of the CTA's two segments (w0, w1) in the ring's order
// (stage j of consumer c is the ring's k = 2 j + c: buffer k % kRing, its round k / kRing; the
// copying threads must fill a shared ring in its order, since a thread two phases ahead passes
// a parity wait that is not yet its own). `fetch(wc, j)` reads what stage j of segment wc needs
// (its block-table entries) a stage ahead, so that their latency passes while the producer
// waits for a buffer and fills the stage before; `fill(buf, k, wc, j, fetched)` copies the
// stage (the ring's k) into buffer buf and arrives on its full mbarrier (a stage past a
// segment's end: only the arrivals). With PDL the stages before the request's first query
// token are copied before griddepcontrol.wait.
template <int kRing, class Fetch, class Fill>
__device__ __forceinline__ void produce_ring(const Int8AttnParams& p, const VerifyWork& w0,
                                             const VerifyWork& w1, int n_max, uint64_t* empty,
                                             Fetch&& fetch, Fill&& fill) {
  bool waited = false;
  auto stage = [&](int k, const VerifyWork& wc, const auto& fetched) {
    const int j = k >> 1;
    const int buf = k % kRing, round = k / kRing;
    trace_at((threadIdx.x & 31) == 0, kTraceProd + 2 * k);
    if (round > 0) mbar_wait(&empty[buf], (round - 1) & 1);
    if (j < wc.n_stages) {
      // a stage wholly before the request's first query token holds no row the kernel
      // before writes (the step's slots): with PDL it is copied before griddepcontrol.wait
      const bool old =
          p.pdl && min(wc.t0 + (j + 1) * kTiles, wc.n_tiles) * kTileSlots <= wc.prefix;
      if (!waited && !old) {
        pdl_wait();
        waited = true;
      }
    }
    fill(buf, k, wc, j, fetched);
  };
  auto f0 = fetch(w0, 0);
  for (int j = 0; j < n_max; ++j) {
    const auto f1 = fetch(w1, j);  // read while stage 2j waits and copies
    stage(2 * j, w0, f0);
    f0 = fetch(w0, j + 1);  // read while stage 2j + 1 waits and copies
    stage(2 * j + 1, w1, f1);
  }
  if (!waited) pdl_wait();
}

// The producer warp with the tensor map: lane l < kTiles copies tile l of each stage (its block
// and slot read a stage ahead) in one TMA box; lane 0's arrival sets the stage's bytes on the
// full mbarrier, the other lanes arrive at once (the stage is in when the bytes are).
template <int HD, int NT>
__device__ __forceinline__ void produce_tma(const Int8AttnParams& p, const CUtensorMap* rows,
                                            int kvh, int shift, const VerifyWork& w0,
                                            const VerifyWork& w1, int n_max, uint8_t* smem) {
  using S = WShape<HD, NT>;
  const int lane = threadIdx.x & 31;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBarOff);
  // a box starts at a 16-byte boundary (the hardware faults on another: an illegal
  // instruction, H100): the head's row lands `shift` (0 or 8) bytes into its shared row, as
  // the cp.async producer's
  const int c0 = static_cast<int>((kvh * p.stride_ch - shift) / 8);
  struct Tile {
    int slot, blk;  // blk -1: no tile
  };
  auto tile_of = [&](const VerifyWork& wc, int j) {
    Tile t{0, -1};
    const int tl = wc.t0 + j * kTiles + lane;
    if (lane < kTiles && j < wc.n_stages && tl < wc.n_tiles) {
      const int pos = tl * kTileSlots;
      t.slot = pos % p.block_size;
      t.blk = wc.bt[pos / p.block_size];
    }
    return t;
  };
  auto fill = [&](int buf, int k, const VerifyWork&, int, const Tile& t) {
    // Boxes land in any order, and with an odd ring a buffer's rounds alternate between the
    // consumers: consumer c waits for round r + 1 of a buffer without having waited for round
    // r (the other consumer's), and a parity wait passes while round r is still in flight
    // (it cannot tell phase r + 1 from r - 1). Stage k waits here until stage k - kTmaLag has
    // landed, so when a consumer sees its stage k - 2 in, stage k - kRing is in too
    // (tests/attention/test_verify_ring_protocol.py models the ring). The cp.async producer
    // needs no lag: a lane's arrival waits for all its earlier copies.
    if (k >= S::kTmaLag) {
      const int done = k - S::kTmaLag;
      mbar_wait(&full[done % S::kRing], (done / S::kRing) & 1);
    }
    const int tiles = __popc(__ballot_sync(~0u, t.blk >= 0));
    trace_at(lane == 0, kTraceProd + 2 * k + 1);
    if (lane == 0) mbar_expect_tx(&full[buf], tiles * kSlots * S::kSRow);
    else mbar_arrive(&full[buf]);
    if (t.blk >= 0)
      tma_load_3d(smem + buf * S::kStageBytes + lane * kSlots * S::kSRow, rows, c0, t.slot,
                  t.blk, &full[buf]);
  };
  produce_ring<S::kRing>(p, w0, w1, n_max, full + S::kRing, tile_of, fill);
}

// The producer warp with cp.async: a lane copies rows `lane` and `lane + 32` of each stage
// (hd / 8 + 1 cp.async a row at immediate offsets from one address: lanes copying the pieces of
// one row together were 2.5-3.8x slower, each copy waiting for the one before to read the
// registers it reuses: attention_h200_notes.md, thirty-sixth session); every stage's full
// mbarrier gets the warp's 32 arrivals once its copies are in.
template <int HD, int NT>
__device__ __forceinline__ void produce(const Int8AttnParams& p, const VerifyWork& w0,
                                        const VerifyWork& w1, int n_max, bool vec16, int shift,
                                        uint8_t* smem) {
  using S = WShape<HD, NT>;
  const int lane = threadIdx.x & 31;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBarOff);
  // stage j of a segment: this lane's rows' positions (-1: none) and block-table entries
  struct Rows {
    int pos[2], blk[2];
  };
  auto rows_of = [&](const VerifyWork& wc, int j) {
    Rows r;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      r.pos[i] = j < wc.n_stages ? stage_row_pos<kTiles>(wc, j, lane + 32 * i) : -1;
      r.blk[i] = r.pos[i] >= 0 ? wc.bt[r.pos[i] / p.block_size] : 0;
    }
    return r;
  };
  auto fill = [&](int buf, int k, const VerifyWork& wc, int j, const Rows& r) {
    trace_at(lane == 0, kTraceProd + 2 * k + 1);
    if (j < wc.n_stages) {
      uint8_t* dst = smem + buf * S::kStageBytes;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (r.pos[i] >= 0)
          copy_row<HD, 1>(cache_row(p, wc, r.pos[i], r.blk[i]),
                          smem_addr(dst + (lane + 32 * i) * S::kSRow), vec16, shift, 0);
      }
    }
    copy_arrive(&full[buf]);
  };
  produce_ring<S::kRing>(p, w0, w1, n_max, full + S::kRing, rows_of, fill);
  cp_async_wait<0>();
}

// A consumer's output (its segment's partial, or the output where `direct`) straight from its
// registers, one column of the lane (8n + 2t + e: query token tq, head hq, factor f) at a time:
// a lane's O^T elements of a column are four consecutive dimensions (the m-blocks' order), so
// each row half is one 16-byte store of its raw accumulators times f. No barrier of both
// consumers and no pass through shared memory: the form through the ring's buffers (a short
// loop of 16-byte pieces after a barrier of both consumers, 8c7cee9) spent 3.3-6.1 us past the
// loops where this spends 2.0-4.3, 0.7-2.5 us less a call, 1.3-2.5 with TMA boxes
// (verify_trace.cu, one H100, 2026-12-07: attention_trace_h100_2026-12-08_verify_regs.md; the
// mapping is checked on the CPU by scripts/emulate_verify_wgmma.py).
template <int HD, int NT>
__device__ __forceinline__ void write_column(const Int8AttnParams& p, const VerifyWork& w,
                                             int sel, int slot, bool direct, int wwarp, int g,
                                             int n, int e, int tq, int hq, float f,
                                             const float (&oacc)[HD / 64][4 * NT]) {
  if constexpr (HD == 256) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float o[4] = {oacc[0][4 * n + 2 * h + e] * f, oacc[1][4 * n + 2 * h + e] * f,
                          oacc[2][4 * n + 2 * h + e] * f, oacc[3][4 * n + 2 * h + e] * f};
      store_column(p, sel, slot, w.q_start, direct, tq, hq, 4 * (16 * wwarp + g + 8 * h), o);
    }
  } else {
    const float o[4] = {oacc[0][4 * n + e] * f, oacc[0][4 * n + 2 + e] * f,
                        oacc[1][4 * n + e] * f, oacc[1][4 * n + 2 + e] * f};
    store_column(p, sel, slot, w.q_start, direct, tq, hq, 4 * (8 * wwarp + g), o);
  }
}

// Consumer warpgroup c (its warp `wwarp` = the stage's tile) over its segment's stages: the
// attention of the segment's columns, written as the segment's partial (or the output where the
// call has one segment).
template <int HD, int NT, bool LM>
__device__ __forceinline__ void consume(const Int8AttnParams& p, const VerifyWork w, int c,
                                        int seg, int n_max, int vshift, uint8_t* smem) {
  using S = WShape<HD, NT>;
  constexpr int T = kTiles;
  constexpr int MB = S::kMBlocks;
  constexpr int KS = S::kKSteps;
  constexpr int KB = NT >= 6 ? KS / 2 : KS;
  constexpr int VB = NT >= 6 ? T / 2 : T;
  const uint8_t* qs = smem + S::kQOff;
  uint8_t* ps = smem + S::kPOff + c * S::kPBytes;
  float* red = reinterpret_cast<float*>(smem + S::kRedOff) + c * S::kRedFloats;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBarOff);
  uint64_t* empty = full + S::kRing;
  const int bar = kBarConsumer + c;
  const int sel = blockIdx.x;
  const int kvh = blockIdx.y;
  const int wwarp = (threadIdx.x >> 5) & 3;  // = its tile of a stage
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  const uint32_t k64 = 0x64646464u | (static_cast<uint32_t>(p.head_dim) >> 16);
  const uint64_t q_desc = make_smem_desc(smem_addr(qs), 128, S::kQSbo);
  const uint64_t p_desc = make_smem_desc(smem_addr(ps), 128, S::kPSbo);

  float oacc[MB][4 * NT];  // O^T: m-block b, this lane's rows and columns
#pragma unroll
  for (int b = 0; b < MB; ++b)
#pragma unroll
    for (int i = 0; i < 4 * NT; ++i) oacc[b][i] = 0.f;
  float m[NT][2];  // running maxima of this lane's columns 8n + 2t + e
  float l[NT][2];  // this lane's share of their row sums
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    m[n][0] = m[n][1] = -INFINITY;
    l[n][0] = l[n][1] = 0.f;
  }
  float run_vmax = 1e-30f;

  const int rg = slot_of_row(g);  // S^T rows g and g + 8 of the warp's tile
  const int rg8 = rg + 8;
  const int r0 = slot_of_row(2 * t);  // V^T k positions 2t, 2t + 1, 2t + 8, 2t + 9
  const int r1 = slot_of_row(2 * t + 1);
  const int r2 = r0 + 8;
  const int r3 = r1 + 8;

  const bool tracer = threadIdx.x % kGroupThreads == 0;  // the consumer's trace_stage thread
  trace_at(tracer, 2 + c);
  for (int st = 0; st < n_max; ++st) {
    const int k = 2 * st + c;
    const int buf = k % S::kRing;
    trace_stage(tracer, c, st, 0);
    mbar_wait(&full[buf], (k / S::kRing) & 1);
    trace_stage(tracer, c, st, 1);
    if (st >= w.n_stages) {  // past the segment's end: the buffer goes straight back
      mbar_arrive(&empty[buf]);
      continue;
    }
    named_sync<kGroupThreads>(bar);  // every warp is done with the previous stage's P^T, red

    const uint8_t* base = smem + buf * S::kStageBytes + vshift;
    const int stage_pos = (w.t0 + st * T) * kSlots;
    const uint8_t* row_g = base + (wwarp * kSlots + rg) * S::kSRow;
    const uint8_t* row_g8 = base + (wwarp * kSlots + rg8) * S::kSRow;

    // ---- S^T = K . Q^T, in batches of KB k-steps (two at 6 n-tiles, where all 16 steps' K
    // fragments next to the accumulators would spill)
    float sacc[4 * NT];
#pragma unroll
    for (int i = 0; i < 4 * NT; ++i) sacc[i] = 0.f;
#pragma unroll
    for (int kb = 0; kb < KS; kb += KB) {
      uint32_t ka[KB][4];
#pragma unroll
      for (int kk = 0; kk < KB / 2; ++kk) {
        const int at = 32 * (kb / 2 + kk) + 8 * t;
        const uint2 x = *reinterpret_cast<const uint2*>(row_g + at);
        const uint2 y = *reinterpret_cast<const uint2*>(row_g8 + at);
        const uint32_t xa = x.x ^ kSignFlip, xb = y.x ^ kSignFlip;
        const uint32_t ya = x.y ^ kSignFlip, yb = y.y ^ kSignFlip;
        ka[2 * kk][0] = f16x2_sel<0x4140>(xa, k64);
        ka[2 * kk][1] = f16x2_sel<0x4140>(xb, k64);
        ka[2 * kk][2] = f16x2_sel<0x4342>(xa, k64);
        ka[2 * kk][3] = f16x2_sel<0x4342>(xb, k64);
        ka[2 * kk + 1][0] = f16x2_sel<0x4140>(ya, k64);
        ka[2 * kk + 1][1] = f16x2_sel<0x4140>(yb, k64);
        ka[2 * kk + 1][2] = f16x2_sel<0x4342>(ya, k64);
        ka[2 * kk + 1][3] = f16x2_sel<0x4342>(yb, k64);
      }
#pragma unroll
      for (int i = 0; i < 4 * NT; ++i) reg_fence(sacc[i]);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < KB; ++s)
        wgmma_f16_rs<NT>(sacc, ka[s], q_desc + static_cast<uint64_t>(16 * (kb + s)),
                         kb + s > 0);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 4 * NT; ++i) reg_fence(sacc[i]);
#pragma unroll
      for (int s = 0; s < KB; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) reg_fence(ka[s][i]);
    }

    trace_stage(tracer, c, st, 2);
    // ---- scores: K scales, the causal mask; the warp's column maxima
    const TileRows tr = tile_rows<HD>(w, row_g, row_g8, stage_pos + wwarp * kSlots, rg, rg8);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e)
        scale_and_mask(p, w, tr, 8 * n + 2 * t + e, sacc[4 * n + e], sacc[4 * n + 2 + e]);
    }
    // P^T of n-tile n from v = rows g (e = 0, 1) and g + 8 (2, 3) of the lane's columns: after
    // the transpose lane (g, t) holds column 8n + g at k (S^T rows) 16 wwarp + 8h + 2t, + 1
    auto store_pt = [&](int n, const float (&v)[4]) {
      uint8_t* prow = ps + n * S::kPSbo + (2 * wwarp) * 128 + g * 16 + 4 * t;
      *reinterpret_cast<uint32_t*>(prow) = transpose8x8(pack_f16x2(v[0], v[1]));
      *reinterpret_cast<uint32_t*>(prow + 128) = transpose8x8(pack_f16x2(v[2], v[3]));
    };

    bool exact = true;
    if constexpr (LM) {
      // The lazy path (after the first stage; int8_verify.cu's): P against the running maxima
      // and the running V-scale maximum as they stand, valid where no score exceeds its
      // column's maximum by more than kLazyHeadroom (P <= 2^8 in fp16) and no V scale the
      // running maximum by kLazyVScaleHeadroom; one barrier publishes P^T and ORs the
      // verdicts, and a stage out of those bounds is redone exactly.
      if (st > 0) {
        const float inv_ref = 1.f / run_vmax;
        bool over = lazy_vscale_over(tr, run_vmax);
        float linc[NT][2];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          float pv[4];
#pragma unroll
          for (int e = 0; e < 2; ++e)
            linc[n][e] = lazy_column(m[n][e], sacc[4 * n + e], sacc[4 * n + 2 + e], tr, inv_ref,
                                     over, pv[e], pv[2 + e]);
          store_pt(n, pv);
        }
        fence_proxy_async();
        if (!named_sync_or<kGroupThreads>(bar, over)) {  // every P^T is in, the accumulators stand
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            l[n][0] += linc[n][0];
            l[n][1] += linc[n][1];
          }
          exact = false;
        }
      }
    }

    if (exact) {
      // ---- the warp's column maxima; the stage's V-scale maximum, the same in every warp
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float mx = tile_rows_max(sacc[4 * n + e], sacc[4 * n + 2 + e]);
          if (g == 0) red[wwarp * S::kN + 8 * n + 2 * t + e] = mx;
        }
      }
      const StageVScale vs =
          stage_vscale<HD, S::kSRow, kStageSlots>(base, stage_pos, w.seq_len, run_vmax);
      run_vmax = vs.new_vmax;
      named_sync<kGroupThreads>(bar);  // every tile's maxima are in

      // ---- the columns' maxima, factors and row sums; P^T into shared memory
      float f[NT][2];
      bool rescale = false;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float pv[4];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * n + 2 * t + e;
          float ms = red[col];
#pragma unroll
          for (int u = 1; u < T; ++u) ms = fmaxf(ms, red[u * S::kN + col]);
          const float a = exact_column(m[n][e], l[n][e], ms, sacc[4 * n + e],
                                       sacc[4 * n + 2 + e], tr, vs.inv_vmax, pv[e], pv[2 + e]);
          f[n][e] = a * vs.vr;
          rescale |= f[n][e] != 1.f;
        }
        store_pt(n, pv);
      }
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int b = 0; b < MB; ++b)
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            oacc[b][4 * n] *= f[n][0];
            oacc[b][4 * n + 1] *= f[n][1];
            oacc[b][4 * n + 2] *= f[n][0];
            oacc[b][4 * n + 3] *= f[n][1];
          }
      }
      fence_proxy_async();
      named_sync<kGroupThreads>(bar);  // the stage's P^T is in
    }

    trace_stage(tracer, c, st, 3);
    // ---- O^T += V^T . P^T: k-step ks is tile ks (k position j: the slot of S^T row j), in
    // batches of VB tiles (two at 6 n-tiles, as S^T's)
#pragma unroll
    for (int kb = 0; kb < T; kb += VB) {
      uint32_t va[VB][MB][4];
#pragma unroll
      for (int ks = 0; ks < VB; ++ks) {
        const uint8_t* tv = base + (kb + ks) * kSlots * S::kSRow + HD + 4;
        const uint8_t* v0 = tv + r0 * S::kSRow;
        const uint8_t* v1 = tv + r1 * S::kSRow;
        const uint8_t* v2 = tv + r2 * S::kSRow;
        const uint8_t* v3 = tv + r3 * S::kSRow;
        if constexpr (HD == 256) {
          // word u = 16 wwarp + g + 8h: dimensions 4u + b are row 16 wwarp + g + 8h of m-block b
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int off = 4 * (16 * wwarp + g + 8 * h);
            uint32_t lo[4], hi[4];
            v_pairs(ld_u32(v0 + off) ^ kSignFlip, ld_u32(v1 + off) ^ kSignFlip, k64, lo);
            v_pairs(ld_u32(v2 + off) ^ kSignFlip, ld_u32(v3 + off) ^ kSignFlip, k64, hi);
#pragma unroll
            for (int b = 0; b < MB; ++b) {
              va[ks][b][h] = lo[b];      // a0 / a1: k 2t, 2t + 1 of rows g / g + 8
              va[ks][b][2 + h] = hi[b];  // a2 / a3: k 2t + 8, 2t + 9
            }
          }
        } else {
          // word u = 8 wwarp + g: dimension 4u + 2b + h is row 16 wwarp + g + 8h of m-block b
          const int off = 4 * (8 * wwarp + g);
          uint32_t lo[4], hi[4];
          v_pairs(ld_u32(v0 + off) ^ kSignFlip, ld_u32(v1 + off) ^ kSignFlip, k64, lo);
          v_pairs(ld_u32(v2 + off) ^ kSignFlip, ld_u32(v3 + off) ^ kSignFlip, k64, hi);
#pragma unroll
          for (int b = 0; b < MB; ++b) {
            va[ks][b][0] = lo[2 * b];
            va[ks][b][1] = lo[2 * b + 1];
            va[ks][b][2] = hi[2 * b];
            va[ks][b][3] = hi[2 * b + 1];
          }
        }
      }
      // after the last batch's loads every read of the stage buffer is behind this thread:
      // back to the producer
      if (kb + VB >= T) mbar_arrive(&empty[buf]);
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int i = 0; i < 4 * NT; ++i) reg_fence(oacc[b][i]);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < VB; ++ks)
#pragma unroll
        for (int b = 0; b < MB; ++b)
          wgmma_f16_rs<NT>(oacc[b], va[ks][b], p_desc + static_cast<uint64_t>(16 * (kb + ks)),
                           1);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int i = 0; i < 4 * NT; ++i) reg_fence(oacc[b][i]);
#pragma unroll
      for (int ks = 0; ks < VB; ++ks)
#pragma unroll
        for (int b = 0; b < MB; ++b)
#pragma unroll
          for (int i = 0; i < 4; ++i) reg_fence(va[ks][b][i]);
    }
    trace_stage(tracer, c, st, 4);
  }
  pdl_trigger(p.pdl, 2);
  if (seg >= p.num_segs) return;  // the grid's last CTA past an odd segment count

  // ---- the row sums: over the lanes of a tile, then over the tiles
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float ls = tile_rows_sum(l[n][e]);
      if (g == 0) red[wwarp * S::kN + 8 * n + 2 * t + e] = ls;
    }
  }
  named_sync<kGroupThreads>(bar);
  float lsum[NT][2];  // the row sums of this lane's columns 8n + 2t + e
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * n + 2 * t + e;
      lsum[n][e] = (red[col] + red[S::kN + col]) + (red[2 * S::kN + col] + red[3 * S::kN + col]);
    }

  // f(n, e, tq, hq, ls) for this lane's columns 8n + 2t + e of the request: token tq, query
  // head hq, row sum ls
  const float inv_group = 1.f / static_cast<float>(p.group);
  auto for_columns = [&](auto&& f) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * n + 2 * t + e;
        if (col >= w.n_cols) continue;
        const ColumnQuery cq = column_query(col, kvh, p.group, inv_group);
        f(n, e, cq.tq, cq.hq, lsum[n][e]);
      }
    }
  };

  // ---- the log2-sum-exp of each column, by the consumer's first warp
  const bool direct = p.num_segs == 1;  // else this consumer's partial is segment seg
  if (!direct && wwarp == 0 && g == 0) {
    for_columns([&](int n, int e, int tq, int hq, float ls) {
      p.part_lse[sel * p.stride_lr + tq * p.stride_lt + hq * p.stride_lh + seg] =
          ls > 0.f ? m[n][e] + log2f(ls) : -INFINITY;
    });
  }

  // ---- O from the registers, a column of the lane at a time (an empty segment's partial is
  // skipped by the merge and not written)
  for_columns([&](int n, int e, int tq, int hq, float ls) {
    if (!(ls > 0.f) && !direct) return;
    write_column<HD, NT>(p, w, sel, seg, direct, wwarp, g, n, e, tq, hq,
                         ls > 0.f ? run_vmax / ls : 0.f, oacc);
  });
  trace_at(tracer, 4 + c);
  trace_at(tracer && c == 0, 6, true);
}

template <int HD, int NT, bool LM>
__global__ void __launch_bounds__(kThreads, 1)
    int8_verify_wgmma_kernel(const __grid_constant__ WgmmaParams wp) {
  using S = WShape<HD, NT>;
  const Int8AttnParams& p = wp.p;
  extern __shared__ __align__(128) uint8_t smem[];
  const int sel = blockIdx.x;
  const int kvh = blockIdx.y;
  VerifyWork w0, w1;  // int8_verify_common.cuh: segments 2 blockIdx.z and 2 blockIdx.z + 1
  if (!w0.init<kTiles>(p, sel, kvh, kConsumers * blockIdx.z)) return;
  w1.init<kTiles>(p, sel, kvh, kConsumers * blockIdx.z + 1);
  const int n_max = max(w0.n_stages, w1.n_stages);
  const bool vec16 = verify_vec16(p);
  const int shift = verify_shift(p, kvh, vec16);

  trace_at(threadIdx.x == 0, 0);
  trace_at(threadIdx.x == 0, 1, true);
  attn_trace::sm_at<kTraceStride>(threadIdx.x == 0, 7);
  if (threadIdx.x == 0) {
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBarOff);
    for (int b = 0; b < S::kRing; ++b) {
      mbar_init(&full[b], 32);  // the producer's lanes
      mbar_init(&full[S::kRing + b], kGroupThreads);  // a consumer's threads
    }
  }
  __syncthreads();  // the barriers are set; from here on only the ring and named barriers
  pdl_trigger(p.pdl, 1);

  if (threadIdx.x >= kConsumerThreads) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x < kConsumerThreads + 32) {
      if (wp.tma) produce_tma<HD, NT>(p, &wp.rows, kvh, shift, w0, w1, n_max, smem);
      else produce<HD, NT>(p, w0, w1, n_max, vec16, shift, smem);
    }
    pdl_trigger(p.pdl, 2);
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  pdl_wait();  // the query is the kernel before's
  stage_query_t<HD, NT, LM>(p, kvh, w0.q_start, w0.n_cols, smem + S::kQOff);
  fence_proxy_async();  // Q^T is read by both consumers' MMAs
  named_sync<kConsumerThreads>(kBarQuery);
  const int c = threadIdx.x / kGroupThreads;
  consume<HD, NT, LM>(p, c ? w1 : w0, c, kConsumers * blockIdx.z + c, n_max, shift, smem);
}

template <int HD, int NT, bool LM>
cudaError_t launch_form(const WgmmaParams& wp, int num_selected, cudaStream_t stream) {
  return launch_verify<int8_verify_wgmma_kernel<HD, NT, LM>>(
      wp.p, num_selected, kThreads, WShape<HD, NT>::kSmem, stream, kConsumers, &wp);
}

// the lazy maxima (p.lazy_max) or the exact per-stage softmax
template <int HD, int NT>
cudaError_t launch(const WgmmaParams& wp, int num_selected, cudaStream_t stream) {
  return wp.p.lazy_max ? launch_form<HD, NT, true>(wp, num_selected, stream)
                       : launch_form<HD, NT, false>(wp, num_selected, stream);
}

template <int HD>
cudaError_t launch_hd(const WgmmaParams& wp, int num_selected, cudaStream_t stream) {
  return for_ntiles(wp.p, [&](auto nt) {
    return launch<HD, decltype(nt)::value>(wp, num_selected, stream);
  });
}

// The cache's rows as WgmmaParams::rows (int8_verify_tma_layout): true where made.
template <int HD>
bool make_rows_map(const Int8AttnParams& p, int64_t num_blocks, CUtensorMap* map) {
  const int64_t row = 2 * HD + 8;
  if (num_blocks <= 0 || !int8_verify_tma_layout(p, row)) return false;
  return encode_cache_rows_map(map, p.cache, p.stride_cn, p.block_size, num_blocks, p.stride_cb,
                               WShape<HD, 1>::kSRow / 8, kSlots);
}

// num_blocks > 0: the producer on the tensor map (cudaErrorNotSupported where it cannot be
// made); 0: on cp.async
template <int HD>
cudaError_t launch_with_map(const Int8AttnParams& p, int64_t num_blocks, int num_selected,
                            cudaStream_t stream) {
  WgmmaParams wp{};
  wp.p = p;
  if (num_blocks > 0) {
    if (!make_rows_map<HD>(p, num_blocks, &wp.rows)) return cudaErrorNotSupported;
    wp.tma = 1;
  }
  return launch_hd<HD>(wp, num_selected, stream);
}

}  // namespace

bool int8_verify_wgmma_supported(int head_dim) { return head_dim == 128 || head_dim == 256; }

cudaError_t int8_verify_wgmma_launch(const Int8AttnParams& p, int64_t num_blocks,
                                     int num_selected, cudaStream_t stream) {
  if (num_selected <= 0 || p.num_kv_heads <= 0 || p.num_segs <= 0) return cudaSuccess;
  if (p.group < 1 || p.max_q < 1 || p.group * p.max_q > kInt8VerifyMaxCols ||
      p.block_size % kSlots != 0 || p.int_qk)
    return cudaErrorInvalidValue;
  switch (p.head_dim) {
    case 128: return launch_with_map<128>(p, num_blocks, num_selected, stream);
    case 256: return launch_with_map<256>(p, num_blocks, num_selected, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace vllm_prism
