"""Every attention kernel under the Triton CPU interpreter, on small contexts.

Started by test_attention_interpreter.py in a subprocess with TRITON_INTERPRET=1 (Triton reads
it when the kernels are defined). Prints one JSON object: check -> {"ok", "detail"}.

The interpreter multiplies in fp32 (the kernels pick fp32 dot operands there), so with an fp32
output the split kernels must match the fp32 reference on the dequantised cache to 2e-5
(relative L2). Paths that round through bf16 (bf16 outputs, the BF16 prefill scratch, which the
interpreter fills by truncation) are held to 1.5e-2.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from attn_helpers import make_batch, poisoned_out, rel_err, with_fresh_rows  # noqa: E402

from vllm_prism.attention.ops import (SplitGeometry, decode_attention,  # noqa: E402
                                      mixed_attention, prefill_attention, reference_attention,
                                      verify_attention)
from vllm_prism.attention.ops import prefill as prefill_mod  # noqa: E402
from vllm_prism.attention.ops.reference import gather_dequantized  # noqa: E402

RESULTS: dict[str, dict] = {}
TIGHT, LOOSE = 2e-5, 1.5e-2
GEOM = SplitGeometry(tile=32, programs_per_sm=2.0, max_segments=8, min_tiles_per_segment=1,
                     num_warps=4, num_stages=1)
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def check(name: str):
    def deco(fn):
        t = time.time()
        try:
            detail = fn()
            RESULTS[name] = {"ok": True, "detail": detail or ""}
        except Exception:  # noqa: BLE001 - report, keep going
            RESULTS[name] = {"ok": False, "detail": traceback.format_exc()[-2000:]}
        RESULTS[name]["seconds"] = round(time.time() - t, 2)
        return fn
    return deco


def ref_of(b):
    return reference_attention(b.q, b.cache, b.block_table, b.seq_lens,
                               b.md.query_start_loc_cpu)


def expect(err: float, tol: float, what: str) -> str:
    assert err < tol, f"{what}: rel err {err:.3g} >= {tol}"
    return f"{what}: rel err {err:.3g}"


for dtype, layout, bs in ((torch.int8, "NHD", 16), (torch.bfloat16, "HND", 32),
                          (torch.int8, "HND", 48)):
    tag = f"{str(dtype).split('.')[-1]}_{layout}_bs{bs}"

    @check(f"decode_{tag}")
    def _decode(dtype=dtype, layout=layout, bs=bs):
        # contexts: 1 token, a partial block, exact tiles, several segments
        b = make_batch([1, 17, 64, 200], [1, 1, 1, 1], dtype, block_size=bs, layout=layout)
        ref = ref_of(b)
        msgs = []
        for segs in (None, 1, 3):
            out = poisoned_out(b.q, torch.float32)
            decode_attention(b.q, b.cache, b.md, out=out, geometry=GEOM, num_segs=segs)
            msgs.append(expect(rel_err(out, ref), TIGHT, f"segments={segs}"))
        if bs == 16:  # 40 segments: the merge kernel splits the head dim (one request)
            b1 = make_batch([200], [1], dtype, block_size=bs, layout=layout, seed=11)
            out = poisoned_out(b1.q, torch.float32)
            decode_attention(b1.q, b1.cache, b1.md, out=out, geometry=GEOM, num_segs=40)
            msgs.append(expect(rel_err(out, ref_of(b1)), TIGHT, "segments=40"))
        out = poisoned_out(b.q)
        decode_attention(b.q, b.cache, b.md, out=out, geometry=GEOM)
        msgs.append(expect(rel_err(out, ref), LOOSE, "bf16 out"))
        return "; ".join(msgs)

    @check(f"verify_{tag}")
    def _verify(dtype=dtype, layout=layout, bs=bs):
        # q_len 2..16; prefix empty (seq_len == q_len), partial blocks, several segments
        qmax = 16 if bs == 16 else 8  # the 16-token (128-row) variant once: it is slow here
        b = make_batch([2, 40, 90, 16], [2, 6, qmax, 5], dtype, block_size=bs, layout=layout,
                       seed=1)
        ref = ref_of(b)
        out = poisoned_out(b.q, torch.float32)
        verify_attention(b.q, b.cache, b.md, out=out, geometry=GEOM, num_segs=3)
        return expect(rel_err(out, ref), TIGHT, "verify")


@check("verify_single_request_k6")
def _verify_k6():
    b = make_batch([97], [6], torch.int8, seed=2)
    ref = ref_of(b)
    msgs = []
    for segs in (1, 2):
        out = poisoned_out(b.q, torch.float32)
        verify_attention(b.q, b.cache, b.md, out=out, geometry=GEOM, num_segs=segs)
        msgs.append(expect(rel_err(out, ref), TIGHT, f"segments={segs}"))
    out = poisoned_out(b.q, torch.float32)
    geom = SplitGeometry(32, 2.0, 8, 1, 4, 1, partial_bf16=True)
    verify_attention(b.q, b.cache, b.md, out=out, geometry=geom, num_segs=3)
    msgs.append(expect(rel_err(out, ref), LOOSE, "bf16 partials"))
    return "; ".join(msgs)


@check("noncausal_blocks")
def _noncausal():
    # a DFlash drafter's blocks: every query token against its request's whole sequence
    from vllm_prism.attention.ops import noncausal_attention

    msgs = []
    for dtype in (torch.int8, torch.bfloat16):
        b = make_batch([6, 40, 97], [6, 6, 6], dtype, block_size=16, seed=4)
        ref = reference_attention(b.q, b.cache, b.block_table, b.seq_lens,
                                  b.md.query_start_loc_cpu, causal=False)
        for segs in (1, 3):
            out = poisoned_out(b.q, torch.float32)
            noncausal_attention(b.q, b.cache, b.md, out=out, geometry=GEOM, num_segs=segs)
            msgs.append(expect(rel_err(out, ref), TIGHT, f"{dtype} segments={segs}"))
    return "; ".join(msgs)


@check("merge_poisoned_empty_segments")
def _merge_poisoned():
    # the log-sum-exp merge against torch: empty segments (lse -inf) hold NaN partial rows,
    # which the kernels never write; the merge must weigh them zero, not read them in
    from vllm_prism.attention.ops.metadata import AttentionMetadata
    from vllm_prism.attention.ops.triton_split_kv import _merge

    g = torch.Generator().manual_seed(7)
    n_sel, max_q, heads, nseg, hs = 2, 3, 4, 5, 32
    part_o = torch.randn(n_sel, max_q, heads, nseg, hs, generator=g)
    lse = torch.randn(n_sel, max_q, heads, nseg, generator=g) * 3
    empty = torch.rand(n_sel, max_q, heads, nseg, generator=g) < 0.4
    empty[..., 0] = False  # every row has a segment
    lse[empty] = float("-inf")
    part_o[empty] = float("nan")
    md = AttentionMetadata.build(torch.zeros(2, 1, dtype=torch.int32), [10, 10], [3, 2])
    out = torch.full((5, heads, hs), float("nan"))
    _merge(part_o, lse, out, md.query_start_loc, md, n_sel, max_q, nseg, False)
    w = torch.exp2(lse - lse.amax(-1, keepdim=True)).masked_fill(empty, 0.0)
    ref = (part_o.nan_to_num() * w[..., None]).sum(-2) / w.sum(-1)[..., None]
    ref = torch.cat([ref[0, :3], ref[1, :2]])  # request 0's three tokens, request 1's two
    assert torch.isfinite(out).all(), "NaN from an empty segment"
    return expect(rel_err(out, ref), TIGHT, "merge")


@check("verify_capture_seq_lens_one")
def _verify_capture():
    # vLLM's Triton builder sets every seq_len to 1 for a full CUDA-graph capture, and Model
    # Runner V2 runs that metadata once as a warm-up with k + 1 query tokens a request: the
    # kernel must read no position below 0 (each query row then sees position 0 alone).
    b = make_batch([4, 3, 5], [4, 3, 5], torch.int8, seed=5)
    b.md.seq_lens.fill_(1)
    qsl = b.md.query_start_loc_cpu.tolist()
    ref = torch.empty(b.q.shape, dtype=torch.float32)
    for r in range(3):
        _, v = gather_dequantized(b.cache, b.block_table[r], 1, b.q.shape[-1])
        ref[qsl[r]:qsl[r + 1]] = v[0].repeat_interleave(b.q.shape[1] // v.shape[1], 0)
    msgs = []
    for segs in (1, 2):
        out = poisoned_out(b.q, torch.float32)
        verify_attention(b.q, b.cache, b.md, out=out, geometry=GEOM, num_segs=segs)
        msgs.append(expect(rel_err(out, ref), TIGHT, f"segments={segs}"))
    return "; ".join(msgs)


PF = SplitGeometry(32, 2.0, 8, 2, 4, 1, prefetch=True)
M64 = SplitGeometry(32, 2.0, 8, 1, 4, 1, block_m_min=64)


@check("prefetch_and_m64_geometries")
def _geometries():
    msgs = []
    for dtype in (torch.int8, torch.bfloat16):
        b = make_batch([1, 33, 100], [1] * 3, dtype, seed=8)
        ref = ref_of(b)
        for name, geom, segs in (("prefetch", PF, None), ("prefetch1seg", PF, 1), ("m64", M64, 3)):
            out = poisoned_out(b.q, torch.float32)
            decode_attention(b.q, b.cache, b.md, out=out, geometry=geom, num_segs=segs)
            msgs.append(expect(rel_err(out, ref), TIGHT, f"decode {name} {dtype}"))
        b = make_batch([7, 70], [4, 8], dtype, seed=9)
        out = poisoned_out(b.q, torch.float32)
        verify_attention(b.q, b.cache, b.md, out=out, geometry=PF, num_segs=2)
        msgs.append(expect(rel_err(out, ref_of(b)), TIGHT, f"verify prefetch {dtype}"))
    b = make_batch([130, 300], [1, 1], torch.int8, seed=10)
    out = poisoned_out(b.q, torch.float32)
    decode_attention(b.q, b.cache, b.md, out=out, geometry=PF, int_qk=True)
    msgs.append(expect(rel_err(out, ref_of(b)), 2e-2, "decode prefetch int_qk"))
    return "; ".join(msgs)


F16 = SplitGeometry(32, 2.0, 8, 1, 4, 1, i8_f16=True)
F16_PF = SplitGeometry(32, 2.0, 8, 2, 4, 1, prefetch=True, i8_f16=True)


@check("int8_fp16_operands")
def _int8_f16():
    """INT8 cache with the K/V operands built as fp16 from their bits (``i8_f16``): decode
    and verification, masked and prefetched tiles, against the fp32 reference. The int8
    values are exact in fp16; Q and P are rounded to fp16 (the fp32 queries of these checks
    otherwise run in fp32), hence fp16's tolerance, not the exact paths' (a wrong conversion
    is off by far more: a code off by one is ~1e-2)."""
    msgs = []
    FP16 = 2e-3
    b = make_batch([1, 33, 100, 130], [1] * 4, torch.int8, seed=12)
    ref = ref_of(b)
    for name, geom, segs in (("f16", F16, 3), ("f16 prefetch", F16_PF, None)):
        out = poisoned_out(b.q, torch.float32)
        decode_attention(b.q, b.cache, b.md, out=out, geometry=geom, num_segs=segs)
        msgs.append(expect(rel_err(out, ref), FP16, f"decode {name}"))
    b = make_batch([7, 70], [4, 8], torch.int8, seed=13)
    out = poisoned_out(b.q, torch.float32)
    verify_attention(b.q, b.cache, b.md, out=out, geometry=F16, num_segs=2)
    msgs.append(expect(rel_err(out, ref_of(b)), FP16, "verify f16"))
    return "; ".join(msgs)


@check("int_qk_error")
def _int_qk():
    b = make_batch([300, 77], [1, 1], torch.int8, seed=3, q_gain=1.0)
    ref = ref_of(b)
    out = poisoned_out(b.q, torch.float32)
    decode_attention(b.q, b.cache, b.md, out=out, geometry=GEOM)
    exact = rel_err(out, ref)
    out = poisoned_out(b.q, torch.float32)
    decode_attention(b.q, b.cache, b.md, out=out, geometry=GEOM, int_qk=True)
    err = rel_err(out, ref)
    assert err < 2e-2, err
    return f"int_qk rel err {err:.3g} (exact path {exact:.3g})"


for dtype in (torch.int8, torch.bfloat16):
    tag = str(dtype).split(".")[-1]

    @check(f"prefill_{tag}")
    def _prefill(dtype=dtype):
        # chunks at context 0, mid-context and crossing section boundaries (sections of 48)
        b = make_batch([150, 60, 33], [70, 60, 20], dtype, q_dtype=torch.float32, seed=4)
        ref = ref_of(b)
        msgs = []
        for sec in (None, 48):
            out = poisoned_out(b.q)
            prefill_attention(b.q, b.cache, b.md, out=out, section_tokens=sec)
            msgs.append(expect(rel_err(out, ref), 1e-4, f"section={sec}"))
        return "; ".join(msgs)


@check("prefill_expanded_gqa")
def _prefill_expanded():
    b = make_batch([130, 45], [100, 45], torch.int8, q_dtype=torch.float32, seed=5)
    ref = ref_of(b)
    old = prefill_mod.NATIVE_GQA, prefill_mod.SQUARE_ROWS
    prefill_mod.NATIVE_GQA, prefill_mod.SQUARE_ROWS = False, 32
    try:
        out = poisoned_out(b.q)
        prefill_attention(b.q, b.cache, b.md, out=out, section_tokens=64)
    finally:
        prefill_mod.NATIVE_GQA, prefill_mod.SQUARE_ROWS = old
    return expect(rel_err(out, ref), 1e-4, "expanded GQA, squares of 32")


for dtype in (torch.int8, torch.bfloat16):
    tag = str(dtype).split(".")[-1]

    @check(f"prefill_fresh_kv_{tag}")
    def _prefill_fresh(dtype=dtype):
        # requests 0 and 2 at context 0 attend to the step's own K and V (different from what
        # their cache holds); request 1 (context 40) reads its cache, through mixed_attention
        b = make_batch([70, 60, 33], [70, 20, 33], dtype, q_dtype=torch.float32, seed=7)
        g = torch.Generator().manual_seed(8)
        shape = (b.q.shape[0], b.cache.shape[1], b.q.shape[2])
        k_new, v_new = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
        ref = with_fresh_rows(ref_of(b), b, k_new, v_new, [0, 2])
        out = poisoned_out(b.q)
        mixed_attention(b.q, b.cache, b.md, out=out, fresh=(k_new, v_new))
        msg = expect(rel_err(out, ref), 1e-4, "fresh K/V at context 0, cache elsewhere")
        out = poisoned_out(b.q)
        mixed_attention(b.q, b.cache, b.md, out=out)
        assert rel_err(out, ref) > 0.1, "without fresh K/V the cache is read (the check bites)"
        return msg


@check("prefill_warm_gather")
def _warm_gather():
    # the gather kernel's warm-up run: position 0 of block 0, dequantised exactly as the fp32
    # reference reads it, once per (device, layout, scratch dtype)
    parts = []
    for dtype, layout in ((torch.int8, "NHD"), (torch.bfloat16, "HND")):
        b = make_batch([40], [40], dtype, layout=layout, seed=9)
        prefill_mod._GATHER_WARM.clear()
        got = prefill_mod.warm_gather_kv(b.cache, torch.float32)
        assert got is not None, "the first call runs the kernel"
        ref = gather_dequantized(b.cache, torch.zeros(1, dtype=torch.int32), 1, b.q.shape[-1])
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=0, atol=0, equal_nan=True)
        assert prefill_mod.warm_gather_kv(b.cache, torch.float32) is None, "once per layout"
        assert prefill_mod.warm_gather_kv(b.cache, torch.bfloat16) is not None, "per dtype"
        parts.append(f"{layout} {str(dtype).split('.')[-1]}: position 0 exact, then cached")
    return "; ".join(parts)


@check("prefill_bf16_query")
def _prefill_bf16_q():
    b = make_batch([120], [50], torch.int8, seed=6)
    ref = ref_of(b)
    out = poisoned_out(b.q)
    prefill_attention(b.q, b.cache, b.md, out=out)
    return expect(rel_err(out, ref), LOOSE, "bf16 query and scratch")


for dtype in (torch.int8, torch.bfloat16):
    tag = str(dtype).split(".")[-1]

    @check(f"mixed_{tag}")
    def _mixed(dtype=dtype):
        # prefill, decode, verify, decode, prefill (chunk at context 0), verify: any order
        b = make_batch([90, 33, 64, 1, 40, 19], [30, 1, 7, 1, 40, 3], dtype, block_size=48,
                       seed=7)
        ref = ref_of(b)
        out = poisoned_out(b.q, torch.float32)
        mixed_attention(b.q, b.cache, b.md, out=out)
        qsl = b.md.query_start_loc_cpu.tolist()
        errs = [rel_err(out[qsl[r]:qsl[r + 1]], ref[qsl[r]:qsl[r + 1]])
                for r in range(len(b.seq_lens))]
        assert max(errs) < LOOSE, errs
        return "per request rel err " + ", ".join(f"{e:.2g}" for e in errs)


if __name__ == "__main__":
    json.dump(RESULTS, sys.stdout)
