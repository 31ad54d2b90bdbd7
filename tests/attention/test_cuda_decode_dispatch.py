"""Which decode attention kernel a call gets (vllm_prism/attention/ops/cuda_decode.py and the
``kernel`` argument of the split-KV API), on the CPU: the CUDA C++ kernel's layout rules, its
segment count, and the refusals a caller sees. The kernel itself is checked on the GPU
(tests/attention/test_attention_gpu.py::test_cuda_decode*)."""

from __future__ import annotations

import logging

import pytest
import torch

from attn_helpers import make_batch, poisoned_out
from vllm_prism.attention.ops import (cuda_decode, decode_attention, kv_format, make_kv_cache,
                                      noncausal_attention, verify_attention)
from vllm_prism.attention.ops import triton_split_kv as split_mod
from vllm_prism.attention.ops.cuda_decode import layout_problem, num_cuda_segments


def _problem(nkv: int = 4, group: int = 6, hs: int = 256, bs: int = 16, layout: str = "NHD",
             dtype: torch.dtype = torch.int8, q_dtype: torch.dtype = torch.bfloat16):
    cache = make_kv_cache(3, nkv, bs, hs, dtype, layout)
    q = torch.empty(2, nkv * group, hs, dtype=q_dtype)
    return layout_problem(q, cache, kv_format(cache, hs), torch.empty_like(q))


def test_layouts_it_takes():
    assert _problem() is None  # Bonsai 2 27B
    assert _problem(nkv=2, group=8, hs=128, bs=32) is None
    assert _problem(nkv=1, group=3, hs=64, bs=784, q_dtype=torch.float16) is None


@pytest.mark.parametrize("kwargs, why", [
    ({"layout": "HND"}, "NHD"),
    ({"hs": 512}, "no kernel for head size 512"),
    ({"nkv": 8}, "with 8 KV heads"),
    ({"group": 12}, "more than 8 query heads"),
    ({"dtype": torch.bfloat16}, "int8_per_token_head"),
    ({"q_dtype": torch.float32}, "bfloat16 or float16"),
])
def test_layouts_it_refuses(kwargs, why):
    assert why in (_problem(**kwargs) or "")


def test_unaligned_query_rows_are_refused():
    cache = make_kv_cache(3, 4, 16, 256, torch.int8)
    q = torch.empty(2, 24, 260, dtype=torch.bfloat16)[..., 1:257]  # rows 2 bytes off
    assert "16-byte" in layout_problem(q, cache, kv_format(cache, 256),
                                         torch.empty(2, 24, 256, dtype=torch.bfloat16))


def test_segments_depend_on_the_batch_only(monkeypatch):
    sms = 132
    assert num_cuda_segments(1, sms) == min(cuda_decode.MAX_SEGMENTS,
                                            sms * cuda_decode.CTAS_PER_SM)
    assert num_cuda_segments(8, sms) == -(-sms * cuda_decode.CTAS_PER_SM // 8)
    assert num_cuda_segments(10_000, sms) == 1
    # the module's CTAs a multiprocessor as it is at the call (a benchmark varies it)
    monkeypatch.setattr(cuda_decode, "CTAS_PER_SM", 1)
    assert num_cuda_segments(1, sms) == sms


def test_kernel_choice_refusals(monkeypatch):
    b = make_batch([40, 70], [1, 1], torch.int8, block_size=16)
    with pytest.raises(ValueError, match="not a CUDA tensor"):
        decode_attention(b.q, b.cache, b.md, out=poisoned_out(b.q), kernel="cuda")
    with pytest.raises(ValueError, match="is not one of"):
        decode_attention(b.q, b.cache, b.md, out=poisoned_out(b.q), kernel="fast")
    monkeypatch.setenv("VLLM_PRISM_ATTN_KERNEL", "fast")
    with pytest.raises(ValueError, match="VLLM_PRISM_ATTN_KERNEL"):
        decode_attention(b.q, b.cache, b.md, out=poisoned_out(b.q))
    v = make_batch([40], [3], torch.int8, block_size=16)
    with pytest.raises(ValueError, match="not a CUDA tensor"):
        verify_attention(v.q, v.cache, v.md, out=poisoned_out(v.q), kernel="cuda")
    f = make_batch([40], [3], torch.bfloat16, block_size=16)
    with pytest.raises(ValueError, match="int8_per_token_head"):
        verify_attention(f.q, f.cache, f.md, out=poisoned_out(f.q), kernel="cuda")
    with pytest.raises(ValueError, match="decode with exact Q.K"):
        decode_attention(b.q, b.cache, b.md, out=poisoned_out(b.q), kernel="cuda", int_qk=True)


def test_verify_lazy_maxima_switch(monkeypatch):
    """The verification kernel's lazy maxima: on unless VLLM_PRISM_ATTN_VERIFY_LAZY=0, a
    module setting (a benchmark's, a test's) over the switch, and what the op is given."""
    calls = []

    class FakeOps:
        def int8_verify_attention(self, *args):
            calls.append(args)

    monkeypatch.setattr(torch.ops, "_C_prism", FakeOps(), raising=False)
    monkeypatch.setattr(cuda_decode, "VERIFY_LAZY_MAX", None)
    args = (None,) * 9 + (0.0625, 6, 4)
    monkeypatch.delenv("VLLM_PRISM_ATTN_VERIFY_LAZY", raising=False)
    assert cuda_decode.verify_lazy_max() is True
    cuda_decode.launch_cuda_verify(*args)
    monkeypatch.setenv("VLLM_PRISM_ATTN_VERIFY_LAZY", "0")
    assert cuda_decode.verify_lazy_max() is False
    cuda_decode.launch_cuda_verify(*args)
    monkeypatch.setattr(cuda_decode, "VERIFY_LAZY_MAX", True)
    assert cuda_decode.verify_lazy_max() is True
    cuda_decode.launch_cuda_verify(*args, int_qk=True)
    assert [c[-2] for c in calls] == [True, False, True]  # lazy_max
    assert [c[-4] for c in calls] == [False, False, True]  # int_qk
    assert [c[-3] for c in calls] == [cuda_decode.VERIFY_DIM_SPLIT] * 3
    assert [c[-1] for c in calls] == [0] * 3  # pdl, the op's last argument


def _fake_verify_ops(monkeypatch) -> list:
    """Both verification ops replaced by recorders (the form, the arguments), the module's form
    left to the switch, every op built; returns the record."""
    calls = []

    class FakeOps:
        def int8_verify_attention(self, *args):
            calls.append(("mma", args))

        def int8_verify_wgmma_attention(self, *args):
            calls.append(("wgmma", args))

    monkeypatch.setattr(torch.ops, "_C_prism", FakeOps(), raising=False)
    monkeypatch.setattr(cuda_decode, "VERIFY_FORM", None)
    monkeypatch.setattr(cuda_decode, "has_compiled_op", lambda name: True)
    return calls


def _launch(kv_cache: torch.Tensor, head_size: int = 256, int_qk: bool = False) -> str:
    """A 6-token verification call of 24 query heads on ``kv_cache``; the form that ran."""
    q = torch.empty(6, 24, head_size, dtype=torch.bfloat16)
    return cuda_decode.launch_cuda_verify(q, kv_cache, *(None,) * 7, 0.0625, 6, 4,
                                          int_qk=int_qk)


def test_verify_form_switch(monkeypatch):
    """The verification kernel's warpgroup-MMA form: only where asked (VLLM_PRISM_ATTN_VERIFY_FORM
    or the module's VERIFY_FORM) and only where it can serve the call (the sm_90a op built,
    compute capability 9.0, head size 128 / 256, exact Q.K); the mma form takes every other
    call, with the same arguments it always had; a bad switch value is refused by name."""
    calls = _fake_verify_ops(monkeypatch)
    cap = {"v": (9, 0)}
    monkeypatch.setattr(cuda_decode, "device_capability", lambda device: cap["v"])
    q = torch.empty(6, 24, 256, dtype=torch.bfloat16)
    args = (q,) + (None,) * 8 + (0.0625, 6, 4)
    monkeypatch.setenv("VLLM_PRISM_ATTN_VERIFY_FORM", "mma")
    assert cuda_decode.launch_cuda_verify(*args) == "mma"
    monkeypatch.setenv("VLLM_PRISM_ATTN_VERIFY_FORM", "wgmma")
    assert cuda_decode.launch_cuda_verify(*args, pdl=True) == "wgmma"
    assert cuda_decode.launch_cuda_verify(*args, int_qk=True) == "mma"
    q128 = torch.empty(6, 16, 128, dtype=torch.bfloat16)
    assert cuda_decode.launch_cuda_verify(q128, *args[1:]) == "wgmma"
    q64 = torch.empty(6, 24, 64, dtype=torch.bfloat16)
    assert cuda_decode.launch_cuda_verify(q64, *args[1:]) == "mma"
    cap["v"] = (8, 9)
    assert cuda_decode.launch_cuda_verify(*args) == "mma"
    cap["v"] = (9, 0)
    monkeypatch.setattr(cuda_decode, "has_compiled_op",
                        lambda name: name != cuda_decode.WGMMA_VERIFY_OP)
    assert cuda_decode.launch_cuda_verify(*args) == "mma"
    monkeypatch.delenv("VLLM_PRISM_ATTN_VERIFY_FORM")
    monkeypatch.setattr(cuda_decode, "has_compiled_op", lambda name: True)
    monkeypatch.setattr(cuda_decode, "VERIFY_FORM", "wgmma")
    assert cuda_decode.launch_cuda_verify(*args) == "wgmma"
    assert [c[0] for c in calls] == ["mma", "wgmma", "mma", "wgmma", "mma", "mma", "mma",
                                     "wgmma"]
    wg = [a for form, a in calls if form == "wgmma"]
    # the wgmma op: the call's tensors, scale, max_q, segments, MIN_TILES, lazy maxima, pdl,
    # tma (off: the "wgmma" form's cp.async producer)
    assert all(a is b for a, b in zip(wg[0][:9], args[:9], strict=True))
    assert wg[0][9:] == (0.0625, 6, 4, cuda_decode.MIN_TILES, cuda_decode.verify_lazy_max(),
                         cuda_decode.pdl_mode(True), False)
    assert wg[1][0] is q128 and wg[2][-2] == 0
    mma = [a for form, a in calls if form == "mma"]
    assert all(len(a) == 17 for a in mma) and mma[1][-4] is True  # int_qk kept
    monkeypatch.setattr(cuda_decode, "VERIFY_FORM", None)
    monkeypatch.setenv("VLLM_PRISM_ATTN_VERIFY_FORM", "fast")
    with pytest.raises(ValueError, match="VLLM_PRISM_ATTN_VERIFY_FORM"):
        cuda_decode.launch_cuda_verify(*args)


def test_verify_form_wgmma_tma(monkeypatch):
    """``VLLM_PRISM_ATTN_VERIFY_FORM=wgmma_tma``: the warpgroup-MMA op with its TMA producer
    (the op's last argument) where the cache is in vLLM's NHD layout with 16-byte slot rows;
    the cp.async producer ("wgmma") for an HND cache, NHD rows of 8 mod 16 bytes (one KV head
    of head size 256) or a cache base off 16 bytes; the mma form where no wgmma form can run."""
    calls = _fake_verify_ops(monkeypatch)
    monkeypatch.setattr(cuda_decode, "device_capability", lambda device: (9, 0))
    monkeypatch.setenv("VLLM_PRISM_ATTN_VERIFY_FORM", "wgmma_tma")

    nhd = make_kv_cache(3, 4, 16, 256, torch.int8, "NHD", "cpu")
    assert _launch(nhd) == "wgmma_tma"
    assert _launch(make_kv_cache(3, 2, 32, 128, torch.int8, "NHD", "cpu"),
                  head_size=128) == "wgmma_tma"
    assert _launch(make_kv_cache(3, 4, 16, 256, torch.int8, "HND", "cpu")) == "wgmma"
    assert _launch(make_kv_cache(3, 1, 16, 256, torch.int8, "NHD", "cpu")) == "wgmma"
    raw = torch.empty(nhd.numel() + 8, dtype=torch.int8)
    off = (8 - raw.data_ptr() % 16) % 16  # a base 8 bytes past a 16-byte boundary
    shifted = raw[off:off + nhd.numel()].view(3, 16, 4, -1).permute(0, 2, 1, 3)
    assert shifted.stride() == nhd.stride() and shifted.data_ptr() % 16 == 8
    assert _launch(shifted) == "wgmma"
    assert _launch(nhd, int_qk=True) == "mma"
    assert [c[0] for c in calls] == ["wgmma"] * 5 + ["mma"]
    assert [c[1][-1] for c in calls[:5]] == [True, True, False, False, False]
    assert calls[0][1][1] is nhd
    assert cuda_decode.tma_layout_problem(nhd, 256) is None
    # HND with 16-byte aligned (padded) slot rows: aligned, but a slot's heads apart
    hnd_padded = torch.empty(3, 4, 16, 528, dtype=torch.int8)[..., :520]
    assert "NHD" in cuda_decode.tma_layout_problem(hnd_padded, 256)


def test_attention_pdl_switch(monkeypatch):
    """Programmatic dependent launch of the attention kernels: where the PQ2 kernels have it
    and VLLM_PRISM_ATTN_PDL is not 0, a module setting over both; never on the CPU."""
    monkeypatch.setattr(cuda_decode, "ATTN_PDL", None)
    monkeypatch.delenv("VLLM_PRISM_ATTN_PDL", raising=False)
    assert cuda_decode.attention_pdl(torch.device("cpu")) is False
    monkeypatch.setattr(cuda_decode, "use_pdl", lambda device: True)
    assert cuda_decode.attention_pdl(torch.device("cpu")) is True
    monkeypatch.setenv("VLLM_PRISM_ATTN_PDL", "0")
    assert cuda_decode.attention_pdl(torch.device("cpu")) is False
    monkeypatch.setattr(cuda_decode, "ATTN_PDL", True)
    assert cuda_decode.attention_pdl(torch.device("cpu")) is True
    monkeypatch.setattr(cuda_decode, "use_pdl", lambda device: False)
    monkeypatch.setattr(cuda_decode, "ATTN_PDL", None)
    monkeypatch.delenv("VLLM_PRISM_ATTN_PDL")
    assert cuda_decode.attention_pdl(torch.device("cpu")) is False


# launch_cuda_decode's positional arguments up to num_segs (a CPU query: no device capability)
_DECODE_ARGS = (torch.empty(0),) + (None,) * 8 + (0.0625, 4)


def _record_decode_arg(monkeypatch, index: int) -> list:
    """A fake int8_decode_attention op that records its argument ``index`` of every call."""
    seen = []

    class FakeOps:
        def int8_decode_attention(self, *args):
            seen.append(args[index])

    monkeypatch.setattr(torch.ops, "_C_prism", FakeOps(), raising=False)
    return seen


def _set_switch(monkeypatch, name: str, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


def test_pdl_mode(monkeypatch):
    """The ops' pdl argument: 0 off; with it, 1 lets the next kernel launch at the kernel's
    start, 2 after its stage loop (the default); anything else is refused by name."""
    calls = _record_decode_arg(monkeypatch, -2)
    args = _DECODE_ARGS
    monkeypatch.setattr(cuda_decode, "ATTN_PDL_TRIGGER", "start")
    cuda_decode.launch_cuda_decode(*args)
    cuda_decode.launch_cuda_decode(*args, pdl=True)
    monkeypatch.setattr(cuda_decode, "ATTN_PDL_TRIGGER", "end")
    cuda_decode.launch_cuda_decode(*args, pdl=True)
    cuda_decode.launch_cuda_decode(*args, pdl=False)
    monkeypatch.undo()
    default = _record_decode_arg(monkeypatch, -2)
    cuda_decode.launch_cuda_decode(*args, pdl=True)  # the module's default placement
    assert calls + default == [0, 1, 2, 0, 2]
    monkeypatch.setattr(cuda_decode, "ATTN_PDL_TRIGGER", "middle")
    with pytest.raises(ValueError, match="ATTN_PDL_TRIGGER"):
        cuda_decode.launch_cuda_decode(*args, pdl=True)


def test_decode_dim_split(monkeypatch):
    """The decode kernel's warps a (tile, KV head), the op's third-to-last argument: by
    default one where it launches with programmatic dependent launch and two where not;
    VLLM_PRISM_ATTN_DECODE_SPLIT=1 / 2 either way; the module setting over both; any other
    value refused by name."""
    splits = _record_decode_arg(monkeypatch, -3)
    monkeypatch.setattr(cuda_decode, "DECODE_DIM_SPLIT", None)
    args = _DECODE_ARGS
    for value in (None, "auto", "2", "1"):
        _set_switch(monkeypatch, "VLLM_PRISM_ATTN_DECODE_SPLIT", value)
        cuda_decode.launch_cuda_decode(*args, pdl=True)
        cuda_decode.launch_cuda_decode(*args, pdl=False)
    monkeypatch.setattr(cuda_decode, "DECODE_DIM_SPLIT", 2)
    cuda_decode.launch_cuda_decode(*args, pdl=True)
    assert splits == [1, 2, 1, 2, 2, 2, 1, 1, 2]
    monkeypatch.setattr(cuda_decode, "DECODE_DIM_SPLIT", None)
    monkeypatch.setenv("VLLM_PRISM_ATTN_DECODE_SPLIT", "3")
    with pytest.raises(ValueError, match="VLLM_PRISM_ATTN_DECODE_SPLIT"):
        cuda_decode.launch_cuda_decode(*args)


def test_decode_copy(monkeypatch, caplog):
    """How the decode kernel copies its tiles, the op's last argument (True: bulk copies):
    cp.async by default and under ``auto``; bulk where asked on compute capability 9.0 and
    newer, cp.async below it with a warning naming the switch; the module setting over the
    switch; any other value refused by name."""
    bulk = _record_decode_arg(monkeypatch, -1)
    monkeypatch.setattr(cuda_decode, "DECODE_COPY", None)
    cuda_decode._log_bulk_fallback.cache_clear()
    args = _DECODE_ARGS
    cap = {"value": (9, 0)}
    monkeypatch.setattr(cuda_decode, "device_capability", lambda device: cap["value"])
    for value in (None, "auto", "cp_async", "bulk"):
        _set_switch(monkeypatch, "VLLM_PRISM_ATTN_DECODE_COPY", value)
        cuda_decode.launch_cuda_decode(*args, pdl=True)
    cap["value"] = (8, 9)
    with caplog.at_level(logging.WARNING, logger=cuda_decode.__name__):
        cuda_decode.launch_cuda_decode(*args)  # still "bulk" from the switch
    assert "VLLM_PRISM_ATTN_DECODE_COPY=bulk" in caplog.text and "(8, 9)" in caplog.text
    cap["value"] = (9, 0)
    monkeypatch.setattr(cuda_decode, "DECODE_COPY", "cp_async")
    cuda_decode.launch_cuda_decode(*args)
    assert bulk == [False, False, False, True, False, False]
    monkeypatch.setattr(cuda_decode, "DECODE_COPY", None)
    monkeypatch.setenv("VLLM_PRISM_ATTN_DECODE_COPY", "tma")
    with pytest.raises(ValueError, match="VLLM_PRISM_ATTN_DECODE_COPY"):
        cuda_decode.launch_cuda_decode(*args)


def test_pdl_only_for_causal_calls(monkeypatch):
    """The CUDA path launches with PDL for causal calls (the step wrote only the query
    tokens' slots), never for a DFlash drafter's non-causal call (its step also writes context
    slots before the draft block), here a one-token draft block that takes the decode
    kernel."""
    seen = []
    monkeypatch.setattr(split_mod, "cuda_decode_problem", lambda *a, **k: None)
    monkeypatch.setattr(split_mod, "attention_pdl", lambda device: True)
    monkeypatch.setattr(split_mod, "_cuda_split_kv",
                        lambda *a, **k: seen.append((a[7], k.get("pdl"))))
    b = make_batch([40, 300], [1, 1], torch.int8, block_size=16)
    decode_attention(b.q, b.cache, b.md, out=poisoned_out(b.q))
    noncausal_attention(b.q, b.cache, b.md, out=poisoned_out(b.q))
    assert seen == [(1, True), (1, False)]  # (max_q, pdl)


@pytest.mark.parametrize("switch", [None, "auto"], ids=["default", "auto"])
def test_verify_form_auto(switch, monkeypatch, caplog):
    """``VLLM_PRISM_ATTN_VERIFY_FORM=auto``, the default: the TMA producer where both its
    kernel and its tensor map can serve the call, the mma form everywhere else (never the
    cp.async producer, no faster than mma), no fallback warning either way, and each form
    that serves named once in the log."""
    calls = _fake_verify_ops(monkeypatch)
    cap = {"v": (9, 0)}
    monkeypatch.setattr(cuda_decode, "device_capability", lambda device: cap["v"])
    if switch is None:
        monkeypatch.delenv("VLLM_PRISM_ATTN_VERIFY_FORM", raising=False)
    else:
        monkeypatch.setenv("VLLM_PRISM_ATTN_VERIFY_FORM", switch)
    cuda_decode._log_served_form.cache_clear()

    nhd = make_kv_cache(3, 4, 16, 256, torch.int8, "NHD", "cpu")
    with caplog.at_level("INFO"):
        assert _launch(nhd) == "wgmma_tma"
        assert _launch(nhd) == "wgmma_tma"
        assert _launch(make_kv_cache(3, 4, 16, 256, torch.int8, "HND", "cpu")) == "mma"
        assert _launch(nhd, int_qk=True) == "mma"
        assert _launch(make_kv_cache(3, 4, 16, 64, torch.int8, "NHD", "cpu"),
                      head_size=64) == "mma"
        cap["v"] = (8, 9)
        assert _launch(nhd) == "mma"
    assert [c[0] for c in calls] == ["wgmma", "wgmma", "mma", "mma", "mma", "mma"]
    assert calls[0][1][-1] is True  # the TMA producer
    named = [r.getMessage() for r in caplog.records if "VERIFY_FORM" in r.getMessage()]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    # the mma form named once per reason, each saying why auto fell back
    line = "vllm-prism: the INT8 verification attention runs the {} form " \
        "(VLLM_PRISM_ATTN_VERIFY_FORM=auto{})"
    assert named == [line.format("wgmma_tma", "")] + [
        line.format("mma", ": " + why) for why in (
            "the cache, its slot or block stride not 16-byte aligned",  # HND: 520-byte slots
            "int_qk runs on the mma form only",
            "no warpgroup-MMA form for head size 64 (head sizes 128, 256 only)",
            "the sm_90a warpgroup MMA runs on compute capability 9.0 only, not (8, 9)")]


