"""The CUDA C++ INT8 decode and verification attention (csrc/attention/int8_decode.cu,
int8_verify.cu) behind the split-KV API.

It serves one query token per request over vLLM's NHD ``int8_per_token_head`` cache: one CTA
per (request, segment) reads the contiguous 16-slot runs of every KV head into shared memory
(16-byte ``cp.async``, three or four tiles in flight) and runs both products on the fp16
tensor cores, the int8 K/V turned into fp16 operands from their bits. The segments' partial
outputs are merged by the same log-sum-exp kernel as the Triton path's. With
``VLLM_PRISM_ATTN_DECODE_COPY=bulk`` (opt-in, compute capability 9.0 and newer) thread 0 copies
each tile as one bulk-copy request instead (:func:`decode_copy`): correct and 0.98-1.02x the
``cp.async`` kernel's time on the H100, so not the default.

:func:`cuda_decode_problem` says why a call cannot take it (``None`` when it can): the
extension not built, a layout other than NHD, a head size / KV head count / GQA group without
a compiled kernel, or unaligned rows. ``decode_attention(kernel="auto")`` (and the
``VLLM_PRISM_ATTN_KERNEL`` switch) takes it wherever it can serve the call.

Verification (2..8 query tokens, at most 48 query tokens x GQA heads) has its own kernel: one
CTA per (request, KV head, segment), four 16-slot tiles a stage (16-byte ``cp.async`` in the
NHD layout, 8-byte in any other), S^T built per tile and column half, the stage's column maxima
and P^T exchanged through shared memory, O^T split over the warps by head dimension, prefix and
causal tail in one pass. ``auto`` takes it wherever it can serve the call: on the H200
1.10-1.41x the Triton kernel at 4K-128K context (benchmarks/results/attention_h200.md). With
``int_qk`` (opt-in, as the Triton path's) it quantises each query column to int8 (absmax /
127) and runs Q.K on the int8 tensor cores straight from the cache's bytes, no K conversion;
written for the shared-memory latency that bounds it (attention_h200_notes.md), not yet timed.
Its warpgroup-MMA form (csrc/attention/int8_verify_wgmma.cu, ``VLLM_PRISM_ATTN_VERIFY_FORM=
wgmma`` or ``VERIFY_FORM``; opt-in: 0.96-1.15x the mma form's time on the H100) runs the same
call warp-specialised: a producer warp copies two segments' stages into a ring, two consumer
warpgroups (one segment each) run S^T and O^T as ``wgmma`` with K and V^T from registers, each
int8 element converted once (the grid is half the segments);
:func:`wgmma_verify_problem` says where it cannot (the "mma" form serves those calls). Its
``wgmma_tma`` form copies each 16-slot tile of a stage as one TMA box of a tensor map over the
cache (four copies a stage instead of a lane's 2 x 33 ``cp.async``), where the cache is in
vLLM's NHD layout (:func:`tma_layout_problem`; the ``cp.async`` producer serves the others);
on the H100 (2026-12-06) 0.74-0.86x the "mma" form's time at 4-8 tokens: a 6-token call
1.25x / 1.23x the two-warp decode kernel's time at 32K / 128K (1.30x / 1.24x the one-warp
form that decode runs with programmatic dependent launch). ``auto``, the default, takes it wherever
it can serve the call and the "mma" form elsewhere (:func:`served_verify_form`); the form that
serves is logged once.

Both kernels and their merge launch with programmatic dependent launch where the PQ2 kernels do
(``VLLM_PRISM_PDL``, Hopper and newer) and ``VLLM_PRISM_ATTN_PDL`` is on (``ATTN_PDL``
overrides both): a kernel starts while the one before it (vLLM's cache writer) finishes and
copies the tiles earlier steps wrote before it waits for it; the merge launches while the
kernel runs (once every CTA has ended its stage loop, or from the kernel's start:
``ATTN_PDL_TRIGGER``) and waits for its partials. Only for causal calls: a DFlash drafter's
step writes context slots before its draft block.
"""

from __future__ import annotations

import functools
import logging

import torch

from vllm_prism import envs
from vllm_prism._custom_ops import has_compiled_op
from vllm_prism.attention.ops.geometry import split_count
from vllm_prism.attention.ops.layout import KVFormat
from vllm_prism.kernels.common import device_capability, use_pdl

__all__ = ["ATTN_PDL", "ATTN_PDL_TRIGGER", "CTAS_PER_SM", "DECODE_COPY",
           "DECODE_DIM_SPLIT", "HEAD_SIZES", "KV_HEADS", "MAX_GROUP",
           "MAX_SEGMENTS", "MAX_VERIFY_COLUMNS", "MIN_TILES", "PARTIALS_DTYPE",
           "VERIFY_CTAS_PER_SM", "VERIFY_DIM_SPLIT", "VERIFY_LAZY_MAX", "attention_pdl",
           "cuda_decode_problem", "cuda_verify_problem", "decode_copy", "decode_dim_split",
           "launch_cuda_decode", "launch_cuda_verify", "layout_problem", "num_cuda_segments",
           "pdl_mode", "verify_form", "verify_lazy_max", "wgmma_verify_problem",
           "served_verify_form", "VERIFY_FORM", "VERIFY_FORMS", "WGMMA_VERIFY_OP"]

logger = logging.getLogger(__name__)

OP = "int8_decode_attention"
VERIFY_OP = "int8_verify_attention"
WGMMA_VERIFY_OP = "int8_verify_wgmma_attention"  # registered where the build has sm_90a
WGMMA_HEAD_SIZES = (128, 256)
# query tokens x query heads per KV head (csrc/attention/int8_attention.cuh)
MAX_VERIFY_COLUMNS = 48
HEAD_SIZES = (64, 128, 256)
KV_HEADS = (1, 2, 4)
MAX_GROUP = 8
TILE = 16  # slots a tile
CTAS_PER_SM = 2  # resident decode CTAs a multiprocessor (about 100 KiB of shared memory each)
# Warps a (16-slot tile, KV head) in the decode kernel, each over 1 / split of the head
# dimension (2: eight warps a CTA, the pair's halves of S^T added through shared memory);
# None: the VLLM_PRISM_ATTN_DECODE_SPLIT switch, by default 1 with programmatic dependent
# launch and 2 without (decode_dim_split; a benchmark or a test sets 1 or 2 here)
DECODE_DIM_SPLIT: int | None = None
# How the decode kernel copies its tiles: "cp_async" (every thread's 16-byte copies), "bulk"
# (one bulk-copy request a 16-slot tile, compute capability 9.0 and newer) or "auto"
# (decode_copy). None: the VLLM_PRISM_ATTN_DECODE_COPY switch; a benchmark or a test sets one.
DECODE_COPY: str | None = None
# verification: resident CTAs a multiprocessor (the kernel's __launch_bounds__; up to 103 KiB of
# shared memory each at head size 256)
VERIFY_CTAS_PER_SM = 2
# verification: 2 lets the pair of warps of a 16-slot tile split S^T's head dimension (each
# converts half of the tile's K, both run every column's MMAs over their half, the partial
# sums handed over through shared memory) where the kernel has that form (head size 256, up to
# 32 columns); 1 splits the columns between them (each converts all of K). A benchmark sets it.
VERIFY_DIM_SPLIT = 2
# verification with exact Q.K: keep each column's running maximum (and the running V-scale
# maximum) across stages while a stage's scores stay within 2^8 of it (one CTA barrier a stage
# fewer, no tile maxima exchanged), the exact per-stage softmax where they do not. On the
# H200 (attention_h200_2026-12-04c.md): 0.89-0.97x the exact form's time at 128K, 0.97-1.01x at
# 32K, the same error. None: the VLLM_PRISM_ATTN_VERIFY_LAZY switch (default on); a benchmark
# or a test sets True or False here.
VERIFY_LAZY_MAX: bool | None = None
# verification's kernel form: "mma" (int8_verify.cu), "wgmma" or "wgmma_tma" (int8_verify_wgmma.cu,
# where wgmma_verify_problem is None; "wgmma_tma": its producer on a TMA tensor map where
# tma_layout_problem is None), or "auto" (served_verify_form: "wgmma_tma" where it can serve
# the call, else "mma"). None: the VLLM_PRISM_ATTN_VERIFY_FORM switch (default "auto");
# a benchmark or a test sets a form here.
VERIFY_FORM: str | None = None
VERIFY_FORMS = envs.CHOICES["VLLM_PRISM_ATTN_VERIFY_FORM"]
MAX_SEGMENTS = 256
# programmatic dependent launch of the kernels and their merge: None follows the switch
# VLLM_PRISM_ATTN_PDL and the PQ2 kernels' choice (use_pdl: VLLM_PRISM_PDL on a Hopper or newer
# GPU); a benchmark or a test sets True or False here
ATTN_PDL: bool | None = None
# where a kernel launched with it lets the next one (the merge) launch: "end" (after its stage
# loop) or "start" (at its start). H200, decode call (attention_h200_2026-12-04e.md,
# --cuda-decompose, two runs): "end" 12.1 against 14.9 us at 4K, 18.9 / 19.3 at 16K, 27.9 /
# 28.1 at 32K, 75.6 / 74.1 at 128K; the 6-token verification call within 0.5 us either way
ATTN_PDL_TRIGGER = "end"
# The segments' partial outputs the CUDA kernels write for the merge: fp32, or fp16 / bf16
# (half the bytes written and read back: 6.3 MB a 32K decode call of the 27B layer in fp32;
# the Triton verification path's partials are bf16). A partial is normalized (a convex
# combination of its segment's V rows), so fp16's range holds it (the kernels saturate past
# it) with 3 more mantissa bits than bf16. bf16 on the H100 (2026-12-08): 0.957x the decode
# call at 32K, error 2.4e-3 against fp32's 1.7e-3. fp16, the kernel alone (decode_trace.cu):
# 0.961x at 32K, 0.987x at 128K, its error 1.2x fp32's where bf16's is 5x; fp32 stays until
# fp16 passes its GPU tests and is timed through the op.
PARTIALS_DTYPE = torch.float32
MIN_TILES = 4  # a segment covers at least 64 context tokens
MIN_CAPABILITY = (8, 0)  # the extension's oldest target (CMakeLists.txt: sm_80)


def _aligned(t: torch.Tensor, elem_strides: tuple[int, ...], align: int) -> bool:
    es = t.element_size()
    return t.data_ptr() % align == 0 and all((s * es) % align == 0 for s in elem_strides)


def cuda_decode_problem(q: torch.Tensor, kv_cache: torch.Tensor, fmt: KVFormat,
                        out: torch.Tensor) -> str | None:
    """Why the CUDA kernel cannot serve this decode call, or None when it can."""
    return _device_problem(q, fmt, OP) or layout_problem(q, kv_cache, fmt, out)


def _device_problem(q: torch.Tensor, fmt: KVFormat, op: str) -> str | None:
    """What of the device, the cache dtype or the build keeps ``op`` from running."""
    if not q.is_cuda:
        return "not a CUDA tensor"
    if not fmt.is_int8:
        return "the cache is not int8_per_token_head"
    if not has_compiled_op(op):
        return "vllm_prism._C is not built"
    cap = device_capability(q.device)
    if cap is None or cap < MIN_CAPABILITY:
        return f"compute capability {cap} below {MIN_CAPABILITY} (cp.async, movmatrix)"
    return None


def layout_problem(q: torch.Tensor, kv_cache: torch.Tensor, fmt: KVFormat,
                   out: torch.Tensor) -> str | None:
    """What of the tensors' layout, shape or alignment the compiled kernels do not take (the
    op checks the same and refuses), or None."""
    if not fmt.is_int8:
        return "the cache is not int8_per_token_head"
    row = 2 * fmt.head_size + 8
    if fmt.stride_head != row or fmt.stride_slot != fmt.num_kv_heads * row:
        return "the cache is not in vLLM's NHD layout"
    if fmt.head_size not in HEAD_SIZES or fmt.num_kv_heads not in KV_HEADS:
        return (f"no kernel for head size {fmt.head_size} with {fmt.num_kv_heads} KV heads "
                f"(head sizes {HEAD_SIZES}, KV heads {KV_HEADS})")
    if q.shape[1] // fmt.num_kv_heads > MAX_GROUP:
        return f"more than {MAX_GROUP} query heads per KV head"
    if fmt.block_size % TILE or kv_cache.data_ptr() % 16 or fmt.stride_block % 16:
        return "cache blocks not 16-byte aligned"
    return _io_problem(q, out)


def cuda_verify_problem(q: torch.Tensor, kv_cache: torch.Tensor, fmt: KVFormat,
                        out: torch.Tensor, max_q: int) -> str | None:
    """Why the CUDA verification kernel cannot serve this call, or None when it can."""
    why = _device_problem(q, fmt, VERIFY_OP)
    if why:
        return why
    if fmt.head_size not in HEAD_SIZES:
        return f"no kernel for head size {fmt.head_size} (head sizes {HEAD_SIZES})"
    cols = q.shape[1] // fmt.num_kv_heads * max_q
    if cols > MAX_VERIFY_COLUMNS:
        return (f"{max_q} query tokens x {q.shape[1] // fmt.num_kv_heads} heads per KV head "
                f"exceed {MAX_VERIFY_COLUMNS} columns")
    if (fmt.block_size % TILE or kv_cache.data_ptr() % 8
            or any(st % 8 for st in (fmt.stride_block, fmt.stride_head, fmt.stride_slot))):
        return "cache rows not 8-byte aligned"
    return _io_problem(q, out)


def _io_problem(q: torch.Tensor, out: torch.Tensor) -> str | None:
    if q.dtype not in (torch.bfloat16, torch.float16) or out.dtype not in (torch.bfloat16,
                                                                           torch.float16):
        return "q / out not bfloat16 or float16"
    if q.stride(2) != 1 or not _aligned(q, (q.stride(0), q.stride(1)), 16):
        return "q head rows not 16-byte aligned"
    if out.stride(2) != 1 or not _aligned(out, (out.stride(0), out.stride(1)), 8):
        return "output head rows not 8-byte aligned"
    return None


def num_cuda_segments(num_selected: int, sms: int, num_kv_heads: int = 1,
                      ctas_per_sm: int | None = None) -> int:
    """Segments per request (decode: a CTA serves every KV head) or per (request, KV head)
    (verification: pass ``num_kv_heads`` and ``VERIFY_CTAS_PER_SM``): about
    ``ctas_per_sm`` (default: CTAS_PER_SM as the module has it now) CTAs per multiprocessor."""
    per_sm = CTAS_PER_SM if ctas_per_sm is None else ctas_per_sm
    return split_count(per_sm, MAX_SEGMENTS, num_selected * num_kv_heads, sms)


def launch_cuda_verify(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                       seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                       req_ids: torch.Tensor | None, out: torch.Tensor, part_o: torch.Tensor,
                       part_lse: torch.Tensor, scale: float, max_q: int, num_segs: int,
                       int_qk: bool = False, pdl: bool = False) -> str:
    """One launch of the verification kernel: ``out`` directly (one segment) or the
    segments' partials; ``int_qk`` runs Q.K on the int8 tensor cores with the query quantised
    per column (opt-in); ``pdl`` (causal calls only): programmatic dependent launch. Returns
    the form that ran (:func:`verify_form` as :func:`served_verify_form` resolves it)."""
    asked = verify_form()
    form, why = _resolve_verify_form(asked, q, kv_cache, int_qk)
    _log_served_form(asked, form, why)
    if form != "mma":
        torch.ops._C_prism.int8_verify_wgmma_attention(
            q, kv_cache, block_table, seq_lens, query_start_loc, req_ids, out, part_o,
            part_lse, float(scale), int(max_q), int(num_segs), MIN_TILES, verify_lazy_max(),
            pdl_mode(pdl), form == "wgmma_tma")
        return form
    torch.ops._C_prism.int8_verify_attention(q, kv_cache, block_table, seq_lens,
                                             query_start_loc, req_ids, out, part_o, part_lse,
                                             float(scale), int(max_q), int(num_segs), MIN_TILES,
                                             bool(int_qk), VERIFY_DIM_SPLIT, verify_lazy_max(),
                                             pdl_mode(pdl))
    return "mma"


def verify_form() -> str:
    """The verification kernel's form asked for: VERIFY_FORM or the switch (VERIFY_FORMS)."""
    return envs.choice("VLLM_PRISM_ATTN_VERIFY_FORM", VERIFY_FORM)


def served_verify_form(asked: str, q: torch.Tensor, kv_cache: torch.Tensor,
                       int_qk: bool = False) -> str:
    """The form that serves a verification call where ``asked`` (VERIFY_FORMS) was asked:
    "mma" as asked, or where no warpgroup-MMA form can serve it (wgmma_verify_problem);
    "wgmma" where "wgmma_tma" was asked and its tensor map cannot cover the cache
    (tma_layout_problem), each fallback warned once. "auto" takes "wgmma_tma" where it can
    serve the call, else "mma", without a warning: the cp.async producer ("wgmma") is no
    faster than the mma form (0.96-1.15x its time on the H100), so "auto" never picks it."""
    return _resolve_verify_form(asked, q, kv_cache, int_qk)[0]


def _resolve_verify_form(asked: str, q: torch.Tensor, kv_cache: torch.Tensor,
                         int_qk: bool = False) -> tuple[str, str | None]:
    """:func:`served_verify_form` and, where "auto" fell back to the mma form, why (the
    launch's log line names it; an explicit form's fallback is warned about here)."""
    if asked == "mma":
        return "mma", None
    why = wgmma_verify_problem(q, int_qk)
    if why is not None:
        if asked != "auto":
            _log_wgmma_fallback(asked, why)
            return "mma", None
        return "mma", why
    if asked == "wgmma":
        return "wgmma", None
    why_tma = tma_layout_problem(kv_cache, q.shape[-1])
    if why_tma is None:
        return "wgmma_tma", None
    if asked == "auto":
        return "mma", why_tma
    _log_tma_fallback(why_tma)
    return "wgmma", None


def wgmma_verify_problem(q: torch.Tensor, int_qk: bool = False) -> str | None:
    """Why the warpgroup-MMA form cannot serve a verification call that the CUDA kernel can
    (cuda_verify_problem is None), or None when it can."""
    if not has_compiled_op(WGMMA_VERIFY_OP):
        return "vllm_prism._C was built without sm_90 among its architectures"
    cap = device_capability(q.device)
    if cap != (9, 0):
        return f"the sm_90a warpgroup MMA runs on compute capability 9.0 only, not {cap}"
    if q.shape[-1] not in WGMMA_HEAD_SIZES:
        sizes = ", ".join(map(str, WGMMA_HEAD_SIZES))
        return f"no warpgroup-MMA form for head size {q.shape[-1]} (head sizes {sizes} only)"
    if int_qk:
        return "int_qk runs on the mma form only"
    return None


def tma_layout_problem(kv_cache: torch.Tensor, head_size: int) -> str | None:
    """Why the "wgmma_tma" form's tensor map cannot cover this int8 cache (the op checks the
    same and refuses), or None: a slot's heads side by side at 8-byte offsets, the cache, its
    slot and block strides 16-byte aligned (vLLM's NHD layout). ``kv_cache`` is the kernels'
    [blocks, KV heads, block size, row] view."""
    row = 2 * head_size + 8
    s_block, s_head, s_slot = kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2)
    if kv_cache.data_ptr() % 16 or s_block % 16 or s_slot % 16 or s_head % 8:
        return "the cache, its slot or block stride not 16-byte aligned"
    if s_head < row or (kv_cache.shape[1] - 1) * s_head + row > s_slot:
        return "a slot's KV heads not side by side (the cache is not in vLLM's NHD layout)"
    return None


@functools.cache
def _log_served_form(asked: str, form: str, why: str | None = None) -> None:
    """Say once per (switch, form, reason) which form serves the verification calls; "auto"
    says why it fell back to the mma form, so an engine's log tells a layout that keeps the
    faster form out from a GPU or head size that has none."""
    logger.info("vllm-prism: the INT8 verification attention runs the %s form "
                "(VLLM_PRISM_ATTN_VERIFY_FORM=%s%s)", form, asked, f": {why}" if why else "")


@functools.cache
def _log_wgmma_fallback(form: str, why: str) -> None:
    logger.warning("VLLM_PRISM_ATTN_VERIFY_FORM=%s: the mma form serves this "
                   "verification call: %s", form, why)


@functools.cache
def _log_tma_fallback(why: str) -> None:
    logger.warning("VLLM_PRISM_ATTN_VERIFY_FORM=wgmma_tma: its cp.async producer (the wgmma "
                   "form) serves this verification call: %s", why)


def pdl_mode(pdl: bool) -> int:
    """The ops' ``pdl`` argument: 0 without programmatic dependent launch, 1 with the next
    kernel let launch at the kernel's start, 2 after its stage loop (ATTN_PDL_TRIGGER)."""
    if not pdl:
        return 0
    if ATTN_PDL_TRIGGER not in ("start", "end"):
        raise ValueError(f"ATTN_PDL_TRIGGER must be 'start' or 'end', not {ATTN_PDL_TRIGGER!r}")
    return 1 if ATTN_PDL_TRIGGER == "start" else 2


def attention_pdl(device: torch.device) -> bool:
    """Whether the kernels and the merge launch with programmatic dependent launch on
    ``device``: ATTN_PDL, or the switch and the PQ2 kernels' choice."""
    if ATTN_PDL is not None:
        return ATTN_PDL
    return envs.VLLM_PRISM_ATTN_PDL and use_pdl(device)


def verify_lazy_max() -> bool:
    """Whether the verification kernel keeps its running maxima across stages: VERIFY_LAZY_MAX
    or the switch."""
    return envs.VLLM_PRISM_ATTN_VERIFY_LAZY if VERIFY_LAZY_MAX is None else VERIFY_LAZY_MAX


def decode_dim_split(pdl: bool) -> int:
    """Warps a (tile, KV head) the decode kernel runs with: DECODE_DIM_SPLIT or the switch,
    else one where it launches with programmatic dependent launch (``pdl``) and two where
    not (attention_h200_notes.md, fortieth section)."""
    if DECODE_DIM_SPLIT:
        return DECODE_DIM_SPLIT
    split = envs.choice("VLLM_PRISM_ATTN_DECODE_SPLIT")
    return int(split) if split != "auto" else (1 if pdl else 2)


def decode_copy(device: torch.device) -> str:
    """How the decode kernel copies its tiles on ``device``: DECODE_COPY or the switch
    (envs.CHOICES), "auto" read as "cp_async"; "bulk" below compute capability 9.0 falls back
    to "cp_async" with a warning (the bulk-copy engine is Hopper's)."""
    if envs.choice("VLLM_PRISM_ATTN_DECODE_COPY", DECODE_COPY) == "bulk":
        cap = device_capability(device)
        if cap is None or cap < (9, 0):
            _log_bulk_fallback(cap)
            return "cp_async"
        return "bulk"
    return "cp_async"


@functools.cache
def _log_bulk_fallback(cap: tuple[int, int] | None) -> None:
    logger.warning("VLLM_PRISM_ATTN_DECODE_COPY=bulk: the INT8 decode kernel copies by "
                   "cp.async on compute capability %s (bulk copies need 9.0 or newer)", cap)


def launch_cuda_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                       seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                       req_ids: torch.Tensor | None, out: torch.Tensor, part_o: torch.Tensor,
                       part_lse: torch.Tensor, scale: float, num_segs: int,
                       pdl: bool = False) -> None:
    """One launch: ``out`` directly (one segment) or the partials for the merge kernel;
    ``pdl`` (causal calls only): programmatic dependent launch."""
    torch.ops._C_prism.int8_decode_attention(q, kv_cache, block_table, seq_lens,
                                             query_start_loc, req_ids, out, part_o, part_lse,
                                             float(scale), int(num_segs), MIN_TILES,
                                             decode_dim_split(pdl), pdl_mode(pdl),
                                             decode_copy(q.device) == "bulk")
