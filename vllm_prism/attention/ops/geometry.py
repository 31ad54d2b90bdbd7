"""Launch geometry of the split-KV kernels, per GPU: tile, segments, warps, pipeline depth.

A request's context is cut into ``num_segments`` segments of whole tiles; one program handles
one (request, KV head, segment), and a second small kernel merges the segments by
log-sum-exp. The number of segments depends only on the batch (never on the context length),
so a step captured in a CUDA graph stays valid when the contexts grow: each program derives its
tile range from ``seq_lens`` on the device, and segments past the end of a short context are
empty (``min_tiles_per_segment`` keeps short contexts from being cut into slivers).

Entries are keyed by a substring of the device name; unknown GPUs get ``DEFAULT`` with the
segment count scaled by their multiprocessor count. The H200 entry comes from
``benchmarks/kernels/bench_attention.py --sweep``
(benchmarks/results/attention_h200_2026-11-29.md); the H100 reuses it unmeasured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_prism.kernels import common

__all__ = ["SplitGeometry", "GpuGeometry", "TABLE", "DEFAULT", "gpu_geometry", "sm_count",
           "num_segments", "split_count"]


@dataclass(frozen=True)
class SplitGeometry:
    tile: int  # keys per tile (a power of two >= 16)
    programs_per_sm: float  # target programs per multiprocessor -> number of segments
    max_segments: int
    min_tiles_per_segment: int
    num_warps: int
    num_stages: int
    partial_bf16: bool = False  # store the per-segment partial outputs in bf16
    prefetch: bool = False  # hand-pipelined K/V loads (one tile ahead), Triton pipelining off
    block_m_min: int = 16  # 64: decode too runs the 64-row (warpgroup MMA) variant
    # INT8 caches: build the K/V MMA operands as fp16 straight from the int8 bits (sign-extend,
    # add 0x6480, reinterpret, subtract 1152: exact, no int->float conversion instructions), with
    # Q and P in fp16 too (fp16 holds every bf16 query of normal range and P more precisely).
    i8_f16: bool = False

    def short(self) -> str:
        return (f"tile{self.tile} pps{self.programs_per_sm:g} seg<={self.max_segments} "
                f"min{self.min_tiles_per_segment} w{self.num_warps} st{self.num_stages}"
                + (" bf16part" if self.partial_bf16 else "") + (" pf" if self.prefetch else "")
                + (f" m{self.block_m_min}" if self.block_m_min > 16 else "")
                + (" f16" if self.i8_f16 else ""))


@dataclass(frozen=True)
class GpuGeometry:
    decode_int8: SplitGeometry
    decode_bf16: SplitGeometry
    verify_int8: SplitGeometry  # wide tiles, few segments
    verify_bf16: SplitGeometry

    def pick(self, verify: bool, int8: bool) -> SplitGeometry:
        if verify:
            return self.verify_int8 if int8 else self.verify_bf16
        return self.decode_int8 if int8 else self.decode_bf16


# H200 (132 SMs), measured 2026-11-29 by benchmarks/kernels/bench_attention.py --sweep (one
# request, 32K and 128K; every variant checked against the fp32 reference in the same run):
# * time is set by the number of programs resident per SM (2 at ~235-255 registers) and by
#   whole waves: 2 programs per SM wins, 3 is worst (1.5 waves), 4 is close to 2;
# * 64-row tiles (warpgroup MMA) stream BF16 better than 16-row ones (164 vs 179 us at 128K)
#   but not INT8 (210 vs 174 us), whose in-register int8->bf16 operands feed the MMA better at
#   16 rows;
# * the hand-prefetched variant (``prefetch``) is slower everywhere (282 vs 174 us): kept as
#   an option for other GPUs, off in the table.
H200 = GpuGeometry(
    decode_int8=SplitGeometry(64, 2.0, 128, 2, 4, 3),
    decode_bf16=SplitGeometry(32, 2.0, 128, 4, 4, 3, block_m_min=64),
    verify_int8=SplitGeometry(32, 2.0, 64, 4, 4, 3, partial_bf16=True),
    verify_bf16=SplitGeometry(32, 2.0, 64, 4, 4, 3, partial_bf16=True),
)
DEFAULT = H200  # unknown GPUs: the H200 choice, segments scaled by their SM count

TABLE: dict[str, GpuGeometry] = {
    "H200": H200,
    "H100": H200,  # same SM; not measured here
}


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; 4 elsewhere (the CPU interpreter)."""
    return common.sm_count(device) or 4


def gpu_geometry(device: torch.device) -> GpuGeometry:
    name = common.device_name(device)
    if name is None:
        return DEFAULT
    for key, geom in TABLE.items():
        if key.lower() in name.lower():
            return geom
    return DEFAULT


def num_segments(geom: SplitGeometry, num_reqs: int, num_kv_heads: int, sms: int) -> int:
    """Segments per (request, KV head): enough programs to give each SM its share."""
    return split_count(geom.programs_per_sm, geom.max_segments, num_reqs * num_kv_heads, sms)


def split_count(programs_per_sm: float, max_segments: int, num_groups: int, sms: int) -> int:
    """Segments per group (a request, or a (request, KV head)) so that ``num_groups`` groups
    give each of ``sms`` multiprocessors about ``programs_per_sm`` programs; it depends on the
    batch only, so a captured CUDA graph stays valid as contexts grow."""
    want = -(-int(sms * programs_per_sm) // max(1, num_groups))
    return max(1, min(max_segments, want))
