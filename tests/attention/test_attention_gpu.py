"""The attention kernels on a CUDA GPU at the real shape (24 query / 4 KV heads, head dim 256)
against the fp32 reference on the dequantised cache, contexts 1 to 128K.

Each batch has a shuffled block table (non-contiguous block ids), a partial last block, and
every byte the kernels must not read poisoned (NaN / NaN scales); outputs are poisoned first.
Tolerance: relative L2 error 1e-2 (bf16 operands and output).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attn_helpers import (GROUP, HKV, make_batch, poisoned_out, rel_err,
                          synchronize_or_fail, with_fresh_rows)
from vllm_prism._custom_ops import has_compiled_op
from vllm_prism.attention.ops import (AttentionMetadata, SplitGeometry, decode_attention,
                                      mixed_attention, noncausal_attention, prefill_attention,
                                      reference_attention, verify_attention, write_kv)
from vllm_prism.attention.ops import cuda_decode
from vllm_prism.attention.ops import prefill as prefill_mod
from vllm_prism.attention.ops import triton_split_kv as split_mod

pytestmark = pytest.mark.gpu
TOL = 1e-2
# The CUDA INT8 decode kernel: fp16 operands (exact int8 K/V, fp16 Q and P in [0, 1]), fp32
# accumulation; its error is the bf16 / fp16 output rounding plus a little.
CUDA_TOL = 4e-3
# the CUDA C++ INT8 decode kernel needs vllm_prism._C (PRISM_BUILD=cuda)
needs_c = pytest.mark.skipif(not has_compiled_op("int8_decode_attention"),
                             reason="vllm_prism._C is not built")
KERNELS = ["triton", pytest.param("cuda", marks=needs_c)]
# the decode kernel's bulk copies (cp.async.bulk) run on compute capability 9.0 and newer
needs_bulk = pytest.mark.skipif(not torch.cuda.is_available()
                                or torch.cuda.get_device_capability() < (9, 0),
                                reason="bulk copies need compute capability 9.0")
DECODE_COPIES = ["cp_async", pytest.param("bulk", marks=needs_bulk)]
DTYPES = [torch.int8, torch.bfloat16]


@pytest.fixture(autouse=True)
def _mma_verify_form(monkeypatch):
    """The CUDA verification tests check the mma form (int8_verify.cu) unless they ask for a
    warpgroup-MMA form (_wgmma_form): the default, "auto", would hand Hopper's NHD calls to
    the TMA form, which its own tests check."""
    monkeypatch.setattr(cuda_decode, "VERIFY_FORM", "mma")


def _ref(b):
    return reference_attention(b.q, b.cache, b.block_table, b.seq_lens, b.md.query_start_loc_cpu)


def _per_request(out, ref, b):
    qsl = b.md.query_start_loc_cpu.tolist()
    return [rel_err(out[qsl[r]:qsl[r + 1]], ref[qsl[r]:qsl[r + 1]])
            for r in range(len(b.seq_lens))]


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode(dtype):
    b = make_batch([1, 17, 1000, 4101, 32771, 131072], [1] * 6, dtype, device="cuda")
    out = poisoned_out(b.q)
    decode_attention(b.q, b.cache, b.md, out=out)
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_large_batch_one_segment(dtype):
    # 96 requests x 4 KV heads fill the GPU: one segment, output written directly
    lens = [int(x) for x in torch.randint(1, 3000, (96,), generator=torch.Generator()
                                          .manual_seed(3))]
    b = make_batch(lens, [1] * len(lens), dtype, device="cuda", block_size=32)
    out = poisoned_out(b.q)
    decode_attention(b.q, b.cache, b.md, out=out)
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, max(errs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_noncausal_blocks(dtype):
    """A DFlash drafter's non-causal blocks (16 and 6 tokens) against contexts to 128K."""
    b = make_batch([16, 4101, 32774, 131078], [16, 6, 6, 6], dtype, device="cuda", seed=5)
    out = poisoned_out(b.q)
    noncausal_attention(b.q, b.cache, b.md, out=out)
    ref = reference_attention(b.q, b.cache, b.block_table, b.seq_lens,
                              b.md.query_start_loc_cpu, causal=False)
    errs = _per_request(out, ref, b)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("dtype", DTYPES)
def test_verify(dtype):
    b = make_batch([2, 100, 5000, 65537, 131072, 40000], [2, 6, 8, 16, 6, 4], dtype,
                   device="cuda", seed=1)
    out = poisoned_out(b.q)
    verify_attention(b.q, b.cache, b.md, out=out)
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill(dtype):
    # a prompt chunk at context 0, a chunk crossing the 32K section boundary, a short one
    b = make_batch([3000, 41500, 700], [3000, 1500, 200], dtype, device="cuda", seed=2)
    out = poisoned_out(b.q)
    prefill_attention(b.q, b.cache, b.md, out=out)
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_fresh_kv(dtype):
    # the chunks at context 0 (requests 0 and 2) attend to the step's own K / V, strided as
    # vLLM passes them (slices of one qkv row); request 1 reads its cache
    b = make_batch([3000, 41500, 700], [3000, 1500, 700], dtype, device="cuda", seed=3)
    n, nkv, hs = b.q.shape[0], b.cache.shape[1], b.q.shape[2]
    g = torch.Generator(device="cuda").manual_seed(4)
    qkv = torch.randn(n, b.q.shape[1] + 2 * nkv, hs, device="cuda", generator=g).bfloat16()
    k_new, v_new = qkv[:, -2 * nkv:-nkv], qkv[:, -nkv:]
    ref = with_fresh_rows(_ref(b), b, k_new, v_new, [0, 2])
    out = poisoned_out(b.q)
    prefill_attention(b.q, b.cache, b.md, out=out, fresh=(k_new, v_new))
    errs = _per_request(out, ref, b)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("dtype", DTYPES)
def test_warm_gather_covers_later_chunks(dtype):
    """After warm_gather_kv (what the PRISM backend runs at vLLM's warm-up), a prompt's chunk
    past context 0 compiles no gather kernel: the warm-up's compilation is the one the real
    chunks use (vLLM's JIT monitor flagged the first one while serving), and the chunk is
    right."""
    knobs = pytest.importorskip("triton").knobs
    compiled: list[str] = []
    prev = knobs.runtime.jit_post_compile_hook

    def hook(**kwargs):
        compiled.append(getattr(kwargs.get("fn"), "name", "?"))
        return prev(**kwargs) if prev else None

    b = make_batch([5000, 33000], [100, 2048], dtype, device="cuda", seed=31)
    knobs.runtime.jit_post_compile_hook = hook
    try:
        prefill_mod._GATHER_WARM.clear()
        assert prefill_mod.warm_gather_kv(b.cache, b.q.dtype, b.q.shape[-1]) is not None
        compiled.clear()
        out = poisoned_out(b.q)
        prefill_attention(b.q, b.cache, b.md, out=out)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_post_compile_hook = prev
    assert "_gather_kv_kernel" not in compiled, compiled
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("dtype", DTYPES)
def test_mixed_hybrid_block_size(dtype):
    # vLLM raises the block size of hybrid models to large multiples of 16: 784 here, HND
    b = make_batch([5000, 1, 70000, 300, 2048, 9000], [1, 1, 6, 300, 2048, 16], dtype,
                   device="cuda", block_size=784, layout="HND", seed=4)
    out = poisoned_out(b.q)
    mixed_attention(b.q, b.cache, b.md, out=out)
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, errs


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_cuda_graph_contexts_grow(kernel):
    """Captured once, replayed after the contexts grew: segments follow seq_lens on device."""
    b = make_batch([50000, 3000, 20], [1, 1, 1], torch.int8, device="cuda", seed=5)
    md = AttentionMetadata.build(b.block_table, [40000, 1000, 5], [1, 1, 1])
    out = poisoned_out(b.q)
    decode_attention(b.q, b.cache, md, out=out, kernel=kernel)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        decode_attention(b.q, b.cache, md, out=out, kernel=kernel)
    md.seq_lens.copy_(torch.tensor(b.seq_lens, dtype=torch.int32))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, errs


# (KV heads, query heads per KV head, head size, block size, query dtype): the 27B's layer, a
# hybrid model's large block, and the other compiled head sizes / KV head counts (a TP shard).
CUDA_SHAPES = [(4, 6, 256, 16, torch.bfloat16), (4, 6, 256, 784, torch.bfloat16),
               (2, 8, 128, 32, torch.float16), (1, 6, 64, 48, torch.bfloat16),
               (4, 3, 64, 16, torch.float16), (2, 6, 256, 16, torch.bfloat16)]


def _check_cuda_segmentations(b, attention, segments=(None, 1)) -> None:
    """``attention`` (decode_attention or verify_attention) on the CUDA kernel with the
    default segment count and with one segment (direct output), or the ``segments`` given,
    against the reference; a failure says where the output is wrong (_error_pattern), a hung
    kernel which call hung (synchronize_or_fail)."""
    ref = _ref(b)
    for segs in segments:
        out = poisoned_out(b.q)
        attention(b.q, b.cache, b.md, out=out, kernel="cuda", num_segs=segs)
        synchronize_or_fail(f"{attention.__name__}, num_segs={segs}, query lengths "
                            f"{b.query_lens}, contexts {b.seq_lens}")
        errs = _per_request(out, ref, b)
        assert max(errs) < CUDA_TOL, (segs, errs, _error_pattern(out, ref, b))


@needs_c
@pytest.mark.parametrize("copy", DECODE_COPIES)
@pytest.mark.parametrize("dim_split", [1, 2])
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: "kv{}_g{}_hs{}_bs{}_{}".format(
    *s[:4], str(s[4]).split(".")[-1]))
def test_cuda_decode(shape, dim_split, copy, monkeypatch):
    """The CUDA C++ INT8 decode kernel, one warp or two a (tile, head), its tiles copied by
    cp.async or by bulk copies: partial first/last tiles, every segment count from one tile
    up, 128K context; and its one-segment (direct output) form."""
    monkeypatch.setattr(cuda_decode, "DECODE_DIM_SPLIT", dim_split)
    monkeypatch.setattr(cuda_decode, "DECODE_COPY", copy)
    nkv, group, hs, bs, qdt = shape
    lens = [1, 15, 16, 17, 1000, 4101, 70001, 131072 if hs == 256 and nkv == 4 else 9000]
    b = make_batch(lens, [1] * len(lens), torch.int8, device="cuda", block_size=bs,
                   head_size=hs, num_kv_heads=nkv, group=group, q_dtype=qdt, seed=11)
    _check_cuda_segmentations(b, decode_attention)


@needs_c
def test_cuda_decode_selected_requests():
    """A mixed step: decode requests picked by index among prefill and verify requests, the
    other rows left untouched by the decode kernel."""
    b = make_batch([3000, 70000, 500, 12, 40000], [1, 6, 1, 12, 1], torch.int8, device="cuda",
                   seed=12)
    out = poisoned_out(b.q)
    mixed_attention(b.q, b.cache, b.md, out=out)
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, errs
    out = poisoned_out(b.q)
    ids = torch.tensor([0, 2, 4], dtype=torch.int32, device="cuda")
    decode_attention(b.q, b.cache, b.md, out=out, req_ids=ids, kernel="cuda")
    qsl = b.md.query_start_loc_cpu.tolist()
    assert torch.isnan(out[qsl[1]:qsl[2]].float()).all()  # request 1 not touched
    errs = [e for r, e in enumerate(_per_request(out, _ref(b), b)) if r in (0, 2, 4)]
    assert max(errs) < CUDA_TOL, errs


_HND_OP_CALL = """
import torch
from attn_helpers import make_batch, poisoned_out
from vllm_prism._custom_ops import has_compiled_op
assert has_compiled_op("int8_decode_attention")
b = make_batch([100, 2000], [1, 1], torch.int8, device="cuda", layout="HND", seed=13)
empty = torch.empty(0, device="cuda")
try:
    torch.ops._C_prism.int8_decode_attention(
        b.q, b.cache, b.md.block_table, b.md.seq_lens, b.md.query_start_loc, None,
        poisoned_out(b.q), empty, empty, 0.0625, 1, 4)
except RuntimeError as e:
    print("refused:", e)
"""


@needs_c
def test_cuda_decode_refusals(child_python):
    """What the CUDA kernels cannot serve is refused by name when asked for, and taken by the
    Triton kernel under ``auto`` (decode in the HND layout, verification past 48 columns)."""
    b = make_batch([100, 2000], [1, 1], torch.int8, device="cuda", layout="HND", seed=13)
    with pytest.raises(ValueError, match="NHD"):
        decode_attention(b.q, b.cache, b.md, out=poisoned_out(b.q), kernel="cuda")
    out = poisoned_out(b.q)
    decode_attention(b.q, b.cache, b.md, out=out)
    assert max(_per_request(out, _ref(b), b)) < TOL
    # the op itself refuses what the kernel cannot read, with the layout it needs (in a child
    # process: its message formats an integer, which crashed the process while the extension
    # carried a static C++ runtime; tests/kernels/test_cmake_runtime.py)
    r = child_python(_HND_OP_CALL, Path(__file__).parent)
    assert r.returncode == 0 and "NHD int8_per_token_head layout" in r.stdout, (
        f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}")
    c = make_batch([100], [2], torch.bfloat16, device="cuda", seed=13)
    with pytest.raises(ValueError, match="int8_per_token_head"):
        decode_attention(c.q, c.cache, c.md, out=poisoned_out(c.q), kernel="cuda")
    with pytest.raises(ValueError, match="int8_per_token_head"):
        verify_attention(c.q, c.cache, c.md, out=poisoned_out(c.q), kernel="cuda")
    b = make_batch([100], [16], torch.int8, device="cuda", seed=13)
    with pytest.raises(ValueError, match="exceed 48 columns"):
        verify_attention(b.q, b.cache, b.md, out=poisoned_out(b.q), kernel="cuda")
    out = poisoned_out(b.q)
    verify_attention(b.q, b.cache, b.md, out=out)  # auto: the Triton kernel takes it
    assert max(_per_request(out, _ref(b), b)) < TOL


# (KV heads, query heads per KV head, head size, block size, layout, query dtype)
VERIFY_SHAPES = [(4, 6, 256, 16, "NHD", torch.bfloat16), (4, 6, 256, 784, "HND", torch.bfloat16),
                 (2, 8, 128, 32, "NHD", torch.float16), (1, 6, 64, 48, "NHD", torch.bfloat16)]
# (query heads per KV head, query tokens of the widest request): every warp layout of the
# verification kernel, which the widest request picks: 8 columns (one warp, one n-tile), 12
# (one warp, two n-tiles), 18 (two warps, the fourth n-tile empty), 30 (two warps, four
# n-tiles), 36 (five warps), 48 (six warps)
VERIFY_COLUMN_CASES = [(4, 2), (6, 2), (6, 3), (6, 5), (6, 6), (6, 8)]


@needs_c
@pytest.mark.parametrize("lazy_max", [False, True])
@pytest.mark.parametrize("shape", VERIFY_SHAPES, ids=lambda s: "kv{}_g{}_hs{}_bs{}_{}".format(
    *s[:5]))
def test_cuda_verify(shape, lazy_max, monkeypatch):
    """The CUDA C++ INT8 verification kernel (the automatic choice): 2..8 query tokens,
    requests of different lengths in one launch, the causal tail inside a tile and across
    tiles, contexts to 70K; many segments and one; NHD (16-byte copies, heads at 0 or 8 mod
    16) and HND (8-byte copies); the exact per-stage softmax and the lazy maxima."""
    monkeypatch.setattr(cuda_decode, "VERIFY_LAZY_MAX", lazy_max)
    _check_cuda_segmentations(_verify_batch(shape), verify_attention)


def _verify_batch(shape):
    """A verification batch of VERIFY_SHAPES' ``shape``: 2..8 query tokens, contexts 2 to 70K,
    the causal tail inside a tile and across tiles."""
    nkv, group, hs, bs, layout, qdt = shape
    q_lens = [2, 6, 3, 8 if group * 8 <= 48 else 6, 5, 4]
    lens = [2, 100, 17, 5000, 70001, 33]
    return make_batch(lens, q_lens, torch.int8, device="cuda", block_size=bs, layout=layout,
                      head_size=hs, num_kv_heads=nkv, group=group, q_dtype=qdt, seed=14)


# the warpgroup-MMA verification form (csrc/attention/int8_verify_wgmma.cu): an sm_90a build on
# compute capability 9.0
needs_wgmma = pytest.mark.skipif(
    not has_compiled_op(cuda_decode.WGMMA_VERIFY_OP) or not torch.cuda.is_available()
    or torch.cuda.get_device_capability() != (9, 0),
    reason="the warpgroup-MMA verification form needs an sm_90a build on compute capability 9.0")


# the warpgroup-MMA forms: its producer on cp.async, or on a TMA tensor map over the cache
WGMMA_FORMS = ["wgmma", "wgmma_tma"]


def _wgmma_form(monkeypatch, form: str = "wgmma") -> list[str]:
    """Asks for a warpgroup-MMA verification form; returns the list of the forms that served
    each verification launch from here on."""
    monkeypatch.setattr(cuda_decode, "VERIFY_FORM", form)
    served: list[str] = []
    launch = cuda_decode.launch_cuda_verify

    def spy(*args, **kwargs):
        served.append(launch(*args, **kwargs))
        return served[-1]

    monkeypatch.setattr(split_mod, "launch_cuda_verify", spy)
    return served


def _error_pattern(out: torch.Tensor, ref: torch.Tensor, b) -> str:
    """Where an output is wrong, for a failing kernel: the relative error by request, by query
    head, by dimension mod 8 and by 64-dimension block, and the NaN count (for the
    warpgroup-MMA form, scripts/emulate_verify_wgmma.py tells which index mapping gives such a
    pattern)."""
    err = (out.float() - ref).abs()
    scale = ref.abs().mean().clamp_min(1e-12)
    qsl = b.md.query_start_loc_cpu.tolist()
    by_req = [round((err[qsl[r]:qsl[r + 1]].mean() / scale).item(), 3)
              for r in range(len(qsl) - 1)]
    by_head = [round((err[:, h].mean() / scale).item(), 3) for h in range(out.shape[1])]
    by_mod8 = [round((err[..., d::8].mean() / scale).item(), 3) for d in range(8)]
    by_block = [round((err[..., d:d + 64].mean() / scale).item(), 3)
                for d in range(0, out.shape[-1], 64)]
    return (f"by request {by_req}, by query head {by_head}, by dim mod 8 {by_mod8}, "
            f"by 64-dim block {by_block}, NaN {int(torch.isnan(out.float()).sum())}")


def _tma_served(form: str, nkv: int, hs: int, layout: str) -> str:
    """The form that serves a call asked for ``form``: "wgmma_tma" needs the NHD layout with a
    slot's rows (nkv heads x (2 hs + 8) bytes) a multiple of 16 bytes, "wgmma" serves the rest."""
    if form == "wgmma_tma" and (layout != "NHD" or nkv * (2 * hs + 8) % 16):
        return "wgmma"
    return form


@needs_wgmma
@pytest.mark.parametrize("form", WGMMA_FORMS)
@pytest.mark.parametrize("lazy_max", [False, True])
@pytest.mark.parametrize("shape", [s for s in VERIFY_SHAPES if s[2] in (128, 256)],
                         ids=lambda s: "kv{}_g{}_hs{}_bs{}_{}".format(*s[:5]))
def test_cuda_verify_wgmma(shape, lazy_max, form, monkeypatch):
    """The verification kernel's warpgroup-MMA form at every head size it has (128, 256):
    2..8 query tokens, requests of different lengths in one launch, the causal tail inside a
    tile and across tiles, contexts to 70K, many segments and one, NHD (heads at 0 or 8 mod
    16) and HND, fp16 and bf16 queries, the exact per-stage softmax and the lazy maxima; every
    launch served by that form. A CTA computes two segments (one a consumer warpgroup), so
    odd segment counts (the last CTA's second consumer past the split) are checked too. Both
    producers: cp.async ("wgmma") and TMA boxes ("wgmma_tma", where the layout allows). Each
    consumer writes its output through the ring's buffers once both loops are done (a
    barrier of both; alone where the CTA's second segment is past the split: 3 and 7)."""
    monkeypatch.setattr(cuda_decode, "VERIFY_LAZY_MAX", lazy_max)
    served = _wgmma_form(monkeypatch, form)
    _check_cuda_segmentations(_verify_batch(shape), verify_attention, (None, 1, 2, 3, 7))
    assert served == [_tma_served(form, shape[0], shape[2], shape[4])] * 5


@needs_wgmma
@pytest.mark.parametrize("form", WGMMA_FORMS)
@pytest.mark.parametrize("lazy_max", [False, True])
@pytest.mark.parametrize("case", VERIFY_COLUMN_CASES, ids=lambda c: f"g{c[0]}_q{c[1]}")
def test_cuda_verify_wgmma_columns(case, lazy_max, form, monkeypatch):
    """The warpgroup-MMA form at every MMA width it is compiled for (8 to 48 columns: 1 to 6
    n-tiles), requests narrower than the widest in the same launch, at the 27B layer's shape;
    both maxima forms, both producers."""
    monkeypatch.setattr(cuda_decode, "VERIFY_LAZY_MAX", lazy_max)
    served = _wgmma_form(monkeypatch, form)
    _check_cuda_segmentations(_columns_batch(case), verify_attention)
    assert served == [form, form]


@needs_wgmma
def test_cuda_verify_wgmma_falls_back_at_head_size_64(monkeypatch):
    """Where the warpgroup-MMA form has no kernel (head size 64) the mma form serves the call,
    still against the reference."""
    served = _wgmma_form(monkeypatch)
    b = make_batch([2, 100, 5000], [2, 6, 4], torch.int8, device="cuda", block_size=48,
                   head_size=64, num_kv_heads=1, group=6, seed=14)
    _check_cuda_segmentations(b, verify_attention)
    assert served == ["mma", "mma"]


@needs_c
@pytest.mark.parametrize("dim_split", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cuda_half_partials(dtype, dim_split, monkeypatch):
    """The CUDA C++ decode and verification kernels writing their segments' partial outputs
    in bf16 or fp16 (cuda_decode.PARTIALS_DTYPE), merged by the log-sum-exp kernel: within
    the fp32 partials' tolerance of the reference, at the 27B layer's shape and a TP shard's."""
    monkeypatch.setattr(cuda_decode, "PARTIALS_DTYPE", dtype)
    monkeypatch.setattr(cuda_decode, "DECODE_DIM_SPLIT", dim_split)
    for nkv, group, hs in ((4, 6, 256), (2, 8, 128)):
        dec = make_batch([17, 4101, 70001], [1, 1, 1], torch.int8, device="cuda",
                         head_size=hs, num_kv_heads=nkv, group=group, seed=21)
        _check_cuda_segmentations(dec, decode_attention)
        ver = make_batch([100, 5000, 70001], [2, 6, 5], torch.int8, device="cuda",
                         head_size=hs, num_kv_heads=nkv, group=group, seed=22)
        _check_cuda_segmentations(ver, verify_attention)


@needs_c
@pytest.mark.parametrize("attention,q_len", [(decode_attention, 1), (verify_attention, 6)],
                         ids=["decode", "verify"])
def test_cuda_fp16_partials_keep_fp32_precision(attention, q_len, monkeypatch):
    """fp16 partials (normalized, 11 significant bits) add next to nothing to the kernels'
    error at the 27B layer over 70K tokens (the op's segment count): within 10 % of the fp32
    partials' error, and below bf16's (8 bits), so the test tells the two half types apart."""
    b = make_batch([70001], [q_len], torch.int8, device="cuda", seed=23)
    ref = _ref(b)
    errs = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        monkeypatch.setattr(cuda_decode, "PARTIALS_DTYPE", dtype)
        out = poisoned_out(b.q)
        attention(b.q, b.cache, b.md, out=out, kernel="cuda")
        synchronize_or_fail(f"{attention.__name__} with {dtype} partials")
        errs[dtype] = max(_per_request(out, ref, b))
    assert errs[torch.float16] <= 1.1 * errs[torch.float32], errs
    assert errs[torch.bfloat16] > errs[torch.float16], errs


@needs_c
@pytest.mark.parametrize("lazy_max", [False, True])
@pytest.mark.parametrize("dim_split", [1, 2])
@pytest.mark.parametrize("case", VERIFY_COLUMN_CASES, ids=lambda c: f"g{c[0]}_q{c[1]}")
def test_cuda_verify_column_blocks(case, dim_split, lazy_max, monkeypatch):
    """The verification kernel's warp layouts (columns = query tokens x GQA heads split over
    one or two n-tiles a warp; with dim_split 2 the pair of warps of a tile splitting S^T's
    head dimension up to 4 n-tiles), requests narrower than the widest in the same launch,
    the causal tail inside and across tiles, against the fp32 reference; the exact per-stage
    softmax and the lazy maxima."""
    monkeypatch.setattr(cuda_decode, "VERIFY_DIM_SPLIT", dim_split)
    monkeypatch.setattr(cuda_decode, "VERIFY_LAZY_MAX", lazy_max)
    _check_cuda_segmentations(_columns_batch(case), verify_attention)


def _columns_batch(case):
    """A verification batch whose widest request has VERIFY_COLUMN_CASES' ``case`` (group,
    query tokens), narrower requests beside it, at the 27B layer's shape."""
    group, max_q = case
    q_lens = [max_q, 2, max(2, max_q - 1), max_q]
    return make_batch([20, 3001, 700, 40000], q_lens, torch.int8, device="cuda",
                      num_kv_heads=4, group=group, head_size=256, seed=16 + max_q)


@needs_c
@pytest.mark.parametrize("form", ["mma"] + [pytest.param(f, marks=needs_wgmma)
                                             for f in WGMMA_FORMS])
@pytest.mark.parametrize("q_len", [4, 6])
def test_cuda_verify_lazy_max_spikes(q_len, form, monkeypatch):
    """The lazy maxima where they must fall back: a few positions deep into the context whose
    keys point along the request's queries (scores far above every earlier one, 2^8 past the
    running maxima) and whose values are 40x larger (V scales past the running maximum), so
    that stages after the first take the exact path again. Against the fp32 reference, and
    the spikes change the output (a kernel that skipped them would fail). The same for the
    warpgroup-MMA form's lazy maxima."""
    monkeypatch.setattr(cuda_decode, "VERIFY_LAZY_MAX", True)
    served = _wgmma_form(monkeypatch, form) if form != "mma" else None
    lens = [5000, 70001]
    b = make_batch(lens, [q_len, q_len], torch.int8, device="cuda", seed=31, q_gain=1.0)
    ref_before = _ref(b)
    qsl = b.md.query_start_loc_cpu.tolist()
    bs = 16  # make_batch's block size
    gen = torch.Generator(device="cuda").manual_seed(32)
    for r, n in enumerate(lens):
        pos = torch.tensor([n * 3 // 5, n * 3 // 5 + 1, n * 9 // 10], device="cuda")
        qmean = b.q[qsl[r]:qsl[r + 1]].float().view(-1, HKV, GROUP, b.q.shape[-1])
        qmean = qmean.mean(dim=(0, 2))  # [nkv, hs]: along every query of the KV head
        k = qmean / qmean.norm(dim=-1, keepdim=True) * 120.0
        k = k.expand(len(pos), -1, -1).contiguous()
        v = torch.randn(len(pos), HKV, b.q.shape[-1], device="cuda", generator=gen) * 40.0
        blocks = b.block_table[r][pos // bs].long()
        write_kv(b.cache, k, v, blocks * bs + pos % bs)
    ref = _ref(b)
    assert rel_err(ref_before, ref) > 0.5  # the spikes dominate the output
    _check_cuda_segmentations(b, verify_attention)
    assert served is None or served == [form, form]


@needs_c
@pytest.mark.parametrize("form", ["mma"] + [pytest.param(f, marks=needs_wgmma)
                                             for f in WGMMA_FORMS])
@pytest.mark.parametrize("v_gain", [8.0, 1e8])
def test_cuda_verify_lazy_vscale_headroom(v_gain, form, monkeypatch):
    """The lazy maxima's V-scale bound (kLazyVScaleHeadroom, 64x the running V-scale maximum):
    values every 97th position from a fifth of the context on, ``v_gain`` times the others.
    8x stays on the lazy path (P times 8 in fp16) and must still match the fp32 reference;
    1e8x is past the bound and must be redone exactly: a lazy P scaled by it overflows fp16,
    so a kernel without the bound fails here. Both change the output (a kernel that skipped
    those rows would fail too)."""
    monkeypatch.setattr(cuda_decode, "VERIFY_LAZY_MAX", True)
    served = _wgmma_form(monkeypatch, form) if form != "mma" else None
    b = make_batch([5000, 70001], [6, 6], torch.int8, device="cuda", seed=33)
    ref_before = _ref(b)
    gen = torch.Generator(device="cuda").manual_seed(34)
    for r, n in enumerate(b.seq_lens):
        pos = torch.arange(n // 5, n - 6, 97, device="cuda")
        v = torch.randn(len(pos), HKV, b.q.shape[-1], device="cuda", generator=gen) * v_gain
        k = torch.randn(len(pos), HKV, b.q.shape[-1], device="cuda", generator=gen)
        blocks = b.block_table[r][pos // 16].long()  # make_batch's block size
        write_kv(b.cache, k, v, blocks * 16 + pos % 16)
    assert rel_err(ref_before, _ref(b)) > 0.1
    _check_cuda_segmentations(b, verify_attention)
    assert served is None or served == [form, form]


@needs_c
@pytest.mark.parametrize("trigger", ["start", "end"])
@pytest.mark.parametrize("q_len", [1, "1-bulk", 6] + [pytest.param(f"6-{f}", marks=needs_wgmma)
                                                       for f in WGMMA_FORMS])
def test_cuda_pdl_reads_new_slots_after_their_writer(q_len, trigger, monkeypatch):
    """Programmatic dependent launch: the step's slots (a request's last ``q_len``) are written
    by a kernel that lets the attention kernel launch at once and writes them after a spin
    (~0.1 ms); the decode / verification kernel copies the older tiles before its wait and
    those slots after it. Against the fp32 reference on the cache as written, and the new
    slots change the output (a kernel that read them early would fail)."""
    from vllm_prism.kernels.common import _triton_has_pdl
    if torch.cuda.get_device_capability() < (9, 0) or not _triton_has_pdl():
        pytest.skip("programmatic dependent launch needs sm_90 and a Triton with gdc")
    from pdl_writer import slow_copy_slots
    monkeypatch.setattr(cuda_decode, "ATTN_PDL", True)
    monkeypatch.setattr(cuda_decode, "ATTN_PDL_TRIGGER", trigger)
    served, form = None, None
    if q_len == "1-bulk":  # decode with its tiles on bulk copies
        monkeypatch.setattr(cuda_decode, "DECODE_COPY", "bulk")
        q_len = 1
    elif isinstance(q_len, str):  # "6-<form>": a warpgroup-MMA verification form
        form = q_len.split("-", 1)[1]
        q_len, served = 6, _wgmma_form(monkeypatch, form)
    lens = [5000, 70001]
    b = make_batch(lens, [q_len, q_len], torch.int8, device="cuda", seed=41, q_gain=1.0)
    old = b.cache.clone()
    ref_old = _ref(b)
    qsl = b.md.query_start_loc_cpu.tolist()
    bs = 16  # make_batch's block size
    gen = torch.Generator(device="cuda").manual_seed(42)
    offsets = []
    for r, n in enumerate(lens):
        pos = torch.arange(n - q_len, n, device="cuda")
        qmean = b.q[qsl[r]:qsl[r + 1]].float().view(-1, HKV, GROUP, b.q.shape[-1])
        qmean = qmean.mean(dim=(0, 2))
        k = (qmean / qmean.norm(dim=-1, keepdim=True) * 120.0).expand(q_len, -1, -1)
        v = torch.randn(q_len, HKV, b.q.shape[-1], device="cuda", generator=gen) * 40.0
        blocks = b.block_table[r][pos // bs].long()
        write_kv(b.cache, k.contiguous(), v, blocks * bs + pos % bs)
        offsets += (blocks * b.cache.stride(0) + (pos % bs) * b.cache.stride(2)).tolist()
    new = b.cache.clone()
    ref = _ref(b)
    assert rel_err(ref_old, ref) > 0.5  # the new slots dominate the output
    attention = decode_attention if q_len == 1 else verify_attention
    for segs in (None, 1):
        b.cache.copy_(old)
        out = poisoned_out(b.q)
        torch.cuda.synchronize()
        slow_copy_slots(b.cache, new, torch.tensor(offsets, device="cuda"),
                        b.cache.stride(2))
        attention(b.q, b.cache, b.md, out=out, kernel="cuda", num_segs=segs)
        torch.cuda.synchronize()
        assert torch.equal(b.cache, new)
        errs = _per_request(out, ref, b)
        assert max(errs) < CUDA_TOL, (segs, errs)
    assert served is None or served == [form, form]


@needs_c
@pytest.mark.parametrize("form", ["mma"] + [pytest.param(f, marks=needs_wgmma)
                                             for f in WGMMA_FORMS])
def test_cuda_verify_selected_requests_and_graph(form, monkeypatch):
    """Verification requests picked by index in a mixed step, captured in a CUDA graph and
    replayed after the contexts grew; every kernel form (the TMA form's tensor map is a
    kernel parameter, captured with the launch)."""
    served = _wgmma_form(monkeypatch, form) if form != "mma" else None
    b = make_batch([3000, 70000, 500, 40000], [6, 1, 4, 6], torch.int8, device="cuda",
                   seed=15)
    md = AttentionMetadata.build(b.block_table, [2000, 70000, 300, 30000], [6, 1, 4, 6])
    ids = torch.tensor([0, 2, 3], dtype=torch.int32, device="cuda")
    out = poisoned_out(b.q)
    verify_attention(b.q, b.cache, md, out=out, req_ids=ids, max_query_len=6, kernel="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        verify_attention(b.q, b.cache, md, out=out, req_ids=ids, max_query_len=6,
                         kernel="cuda")
    md.seq_lens.copy_(torch.tensor(b.seq_lens, dtype=torch.int32))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    qsl = b.md.query_start_loc_cpu.tolist()
    assert torch.isnan(out[qsl[1]:qsl[2]].float()).all()  # request 1 not selected
    errs = [e for r, e in enumerate(_per_request(out, _ref(b), b)) if r != 1]
    assert max(errs) < CUDA_TOL, errs
    assert served is None or served == [form, form]


def test_int_qk_error():
    """Integer Q.K (opt-in) against the exact path: both vs the fp32 reference."""
    b = make_batch([32768, 4096, 131072], [1, 1, 1], torch.int8, device="cuda", seed=6,
                   q_gain=1.0)
    ref = _ref(b)
    out = poisoned_out(b.q)
    decode_attention(b.q, b.cache, b.md, out=out)
    exact = rel_err(out, ref)
    decode_attention(b.q, b.cache, b.md, out=out, int_qk=True)
    err = rel_err(out, ref)
    print(f"\nint_qk rel err {err:.4g}, exact path {exact:.4g}")
    assert exact < TOL and err < 3e-2


@needs_c
@pytest.mark.parametrize("shape", VERIFY_SHAPES, ids=lambda s: "kv{}_g{}_hs{}_bs{}_{}".format(
    *s[:5]))
@pytest.mark.parametrize("dim_split", [1, 2])
def test_cuda_verify_int_qk(shape, dim_split, monkeypatch):
    """Integer Q.K in the CUDA verification kernel (opt-in): every compiled head size, both
    copy layouts, both warp splits of S^T, many segments and one, against the fp32 reference
    within the integer path's bound, no further from it than the Triton kernel's integer Q.K
    (the same query quantisation, absmax / 127 per token and head) allows, and not the exact
    path."""
    monkeypatch.setattr(cuda_decode, "VERIFY_DIM_SPLIT", dim_split)
    nkv, group, hs, bs, layout, qdt = shape
    q_lens = [2, 6, 3, 6, 5]
    lens = [2, 100, 17, 5000, 70001]
    b = make_batch(lens, q_lens, torch.int8, device="cuda", block_size=bs, layout=layout,
                   head_size=hs, num_kv_heads=nkv, group=group, q_dtype=qdt, seed=21,
                   q_gain=1.0)
    ref = _ref(b)
    out = poisoned_out(b.q)
    verify_attention(b.q, b.cache, b.md, out=out, kernel="triton", int_qk=True)
    triton_err = rel_err(out, ref)
    verify_attention(b.q, b.cache, b.md, out=out, kernel="cuda")
    exact = rel_err(out, ref)
    for segs in (None, 1):
        out = poisoned_out(b.q)
        verify_attention(b.q, b.cache, b.md, out=out, kernel="cuda", int_qk=True,
                         num_segs=segs)
        err = rel_err(out, ref)
        print(f"\nsegs {segs}: int_qk rel err {err:.4g} (Triton int_qk {triton_err:.4g}, "
              f"exact {exact:.4g})")
        assert err < 3e-2 and err < 1.5 * triton_err + 2e-3, (segs, err, triton_err)
        assert err > exact, (segs, err, exact)  # the integer path ran


GEOMETRIES = [  # every kernel variant the geometry table can pick on this GPU
    SplitGeometry(32, 2.0, 128, 4, 4, 1, prefetch=True),
    SplitGeometry(64, 2.0, 128, 2, 8, 1, prefetch=True),
    SplitGeometry(32, 2.0, 128, 4, 4, 3, block_m_min=64),
    SplitGeometry(32, 2.0, 64, 4, 8, 1, partial_bf16=True, prefetch=True, block_m_min=64),
    SplitGeometry(64, 2.0, 128, 2, 4, 3, partial_bf16=True),
    SplitGeometry(64, 2.0, 128, 2, 4, 3, i8_f16=True),
    SplitGeometry(32, 2.0, 64, 4, 4, 3, partial_bf16=True, i8_f16=True),
]


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: g.short().replace(" ", "_"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_geometry_variants(dtype, geom):
    b = make_batch([1, 17, 3000, 70001], [1] * 4, dtype, device="cuda", seed=7)
    out = poisoned_out(b.q)
    decode_attention(b.q, b.cache, b.md, out=out, geometry=geom, kernel="triton")
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, errs
    b = make_batch([3, 900, 70001], [3, 6, 8], dtype, device="cuda", seed=8)
    out = poisoned_out(b.q)
    verify_attention(b.q, b.cache, b.md, out=out, geometry=geom)
    errs = _per_request(out, _ref(b), b)
    assert max(errs) < TOL, errs
