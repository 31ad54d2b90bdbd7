"""CPU tests of the PQ2 kernel package that need no Triton: layouts (exact), the torch
producer, argument checks and the kernel dispatch with its environment switch."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from pq2_reference import (dense, quantize_q8, random_signs, random_ternary, reference_linear,
                           rel_err)

from vllm_prism.gguf import codecs_torch
from vllm_prism.gguf.constants import GGMLType
from vllm_prism.gguf.hadamard import forward_transform
from vllm_prism.kernels.pq2 import dispatch
from vllm_prism.kernels.pq2.hadamard import ActKind, transform_activation_torch
from vllm_prism.kernels.pq2.layout import (PQ2Weight, PTQ1Weight, is_ternary_plane,
                                           note_ternary_plane)


@pytest.mark.parametrize("n,k", [(1, 128), (7, 384), (33, 5120)])
def test_pq2_planes_are_exact(n: int, k: int) -> None:
    raw, q, d = random_ternary(n, k, "PQ2_0", torch.Generator().manual_seed(n))
    w = PQ2Weight.from_raw(raw)
    assert w.codes.dtype == torch.int32 and w.codes.shape == (n, k // 16)
    assert w.scales.stride(0) % 8 == 0  # 16-byte aligned rows
    assert torch.equal(w.to_raw(), raw)
    wq, wd = w.unpack()
    assert torch.equal(wq, q) and torch.equal(wd, d)
    # element j = 16w + 4q + b of a row: word w, bits 8b + 2q
    for j in (0, 5, 77 % k, k - 1):
        e = j % 16
        bits = 8 * (e % 4) + 2 * (e // 4)
        assert ((w.codes[0, j // 16] >> bits) & 3).item() == q[0, j].item() + 1
    assert torch.equal(w.dequantize(), dense(raw, "PQ2_0", torch.float32))


def test_code_three_is_plus_two() -> None:
    raw = torch.full((1, 34), 0xFF, dtype=torch.uint8)
    raw[0, :2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    assert torch.equal(PQ2Weight.from_raw(raw).dequantize(), torch.full((1, 128), 2.0))


@pytest.mark.parametrize("field", [0, 7, 15])
def test_a_code_three_anywhere_is_found(field: int) -> None:
    """Planes with one 3 (in the word's lowest, a middle and the sign-bit field) are not
    ternary; the same rows with that 3 made a 2 are, and are recorded by address."""
    raw, q, _ = random_ternary(5, 384, "PQ2_0", torch.Generator().manual_seed(field),
                               code3=False)
    w = PQ2Weight.from_raw(raw)
    assert w.ternary is True and w.is_ternary() and is_ternary_plane(w.codes)
    assert PQ2Weight.of_planes(w.codes, w.scales, None, None).is_ternary()
    # element 16 * word + 4 * f + b sits in field bits 8b + 2f: pick the element of `field`
    e = 16 * 3 + 4 * (field % 4) + field // 4
    q3 = q.clone()
    q3[2, e] = 2
    w3 = PQ2Weight.from_raw(codecs_torch.pack_blocks(q3, _scales(raw), GGMLType.PQ2_0))
    assert ((w3.codes[2, 3] >> (2 * field)) & 3).item() == 3
    assert w3.ternary is False and not w3.is_ternary() and not is_ternary_plane(w3.codes)
    assert not PQ2Weight.of_planes(w3.codes, w3.scales, None, None).is_ternary()


def _scales(raw: torch.Tensor) -> torch.Tensor:
    """The fp16 d of PQ2_0 rows."""
    return PQ2Weight.from_raw(raw).unpack()[1]


def test_ternary_record_follows_the_planes_life() -> None:
    """The record holds a plane weakly: a view of another shape, or a plane that died, is not
    taken for it; a Parameter noted over a plane keeps the record alive after the plane goes."""
    import gc

    raw, _, _ = random_ternary(4, 256, "PQ2_0", torch.Generator().manual_seed(2), code3=False)
    w = PQ2Weight.from_raw(raw)
    assert not is_ternary_plane(w.codes[:2, :8])  # same address, another shape
    assert not is_ternary_plane(w.codes.clone())  # same shape, another address
    param = torch.nn.Parameter(w.codes, requires_grad=False)
    codes_copy = w.codes.clone()
    del w
    gc.collect()
    assert not is_ternary_plane(param)  # its plane died with the weight
    note_ternary_plane(param)
    assert is_ternary_plane(param) and is_ternary_plane(param.data)
    del param
    gc.collect()
    assert not is_ternary_plane(codes_copy)
    # transcoded PTQ1_0 holds trits only
    praw, _, _ = random_ternary(3, 256, "PTQ1_0", torch.Generator().manual_seed(3))
    assert PQ2Weight.from_ptq1_raw(praw).is_ternary()
    assert PTQ1Weight.from_raw(praw).as_pq2().is_ternary()


def test_ptq1_planes_and_pq2_copy() -> None:
    raw, q, d = random_ternary(9, 640, "PTQ1_0", torch.Generator().manual_seed(1))
    w = PTQ1Weight.from_raw(raw)
    assert torch.equal(w.to_raw(), raw)
    assert torch.equal(w.to_raw(slice(2, 5)), raw[2:5])
    assert torch.equal(w.as_pq2(chunk_rows=4).dequantize(), dense(raw, "PTQ1_0", torch.float32))


def test_bad_arguments_raise() -> None:
    raw, _, _ = random_ternary(2, 256, "PQ2_0", torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="34-byte"):
        PQ2Weight.from_raw(raw[:, :-1])
    with pytest.raises(ValueError, match="power of two"):
        PQ2Weight.from_raw(raw, torch.ones(256), 96)
    with pytest.raises(ValueError, match="without hadamard_block"):
        PQ2Weight.from_raw(raw, torch.ones(256), None)
    unfolded = PQ2Weight.from_raw(raw, None, 1024)  # no signs: not folded, block ignored
    assert unfolded.signs is None and unfolded.hadamard_block is None
    with pytest.raises(ValueError, match="K = 100"):
        dispatch.pq2_linear(torch.randn(1, 100), PQ2Weight.from_raw(raw))


@pytest.mark.parametrize("block", [64, 256])
def test_torch_producer(block: int) -> None:
    gen = torch.Generator().manual_seed(block)
    x = torch.randn(3, 512, generator=gen)
    s = random_signs(512, gen)
    xt = forward_transform(x, s, block)
    assert torch.equal(transform_activation_torch(x, s, block).data, xt)
    qr, sr = quantize_q8(xt)
    a = transform_activation_torch(x, s, block, ActKind.Q8)
    assert torch.equal(a.data.int(), qr) and torch.allclose(a.group_scale, sr)
    f = transform_activation_torch(x, s, block, ActKind.F32_PERM)
    assert torch.allclose(f.group_sum, xt.reshape(3, 4, 128).sum(-1))


def test_dispatch_on_cpu_uses_torch_and_env_override(monkeypatch, caplog) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(2)
    raw, _, _ = random_ternary(16, 256, "PQ2_0", gen)
    s = random_signs(256, gen)
    w = PQ2Weight.from_raw(raw, s, 128)
    x = torch.randn(2, 3, 256, generator=gen)
    dispatch._select.cache_clear()
    assert dispatch.select_kernel(6, w, x.dtype).name == "torch"
    y = dispatch.pq2_linear(x, w)
    assert y.shape == (2, 3, 16)
    ref = reference_linear(x.reshape(6, 256), raw, "PQ2_0", s, 128).reshape(2, 3, 16)
    assert rel_err(y, ref) < 1e-6
    monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "gemv_a8")
    dispatch._select.cache_clear()
    dispatch._logged.clear()
    with caplog.at_level(logging.WARNING, logger="vllm_prism.kernels.pq2.dispatch"):
        assert dispatch.select_kernel(1, w, x.dtype).name == "torch"
        assert dispatch.select_kernel(2, w, x.dtype).name == "torch"  # no second warning
    assert "VLLM_PRISM_PQ2_KERNEL: gemv_a8 cannot run" in caplog.text
    assert caplog.text.count("gemv_a8 cannot run") == 1
    monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "nonsense")
    dispatch._select.cache_clear()
    with caplog.at_level(logging.WARNING, logger="vllm_prism.kernels.pq2.dispatch"):
        assert dispatch.select_kernel(1, w, x.dtype).name == "torch"
    assert "is not a kernel" in caplog.text
    dispatch._select.cache_clear()


def _interpreted_weight(monkeypatch, kernel_env: str) -> PQ2Weight:
    """A small PQ2 weight for dispatch tests under the Triton interpreter, with
    ``VLLM_PRISM_PQ2_KERNEL`` set and the choice cache cleared (callers clear it again)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", kernel_env)
    gen = torch.Generator().manual_seed(3)
    raw, _, _ = random_ternary(16, 256, "PQ2_0", gen)
    dispatch._select.cache_clear()
    return PQ2Weight.from_raw(raw, random_signs(256, gen), 128)


def test_env_override_tries_a_list_of_kernels_in_order(monkeypatch) -> None:
    """``VLLM_PRISM_PQ2_KERNEL=a,b``: the first that can run the call (here under the Triton
    interpreter: mma_a16 takes M >= 2, so M = 1 falls to gemv_a8; the CUDA C++ kernels need a
    GPU), unknown names skipped, the automatic order last."""
    w = _interpreted_weight(monkeypatch, "nonsense,mma_cuda,mma_a16,gemv_a8")
    try:
        assert dispatch.select_kernel(1, w, torch.bfloat16).name == "gemv_a8"
        assert dispatch.select_kernel(5, w, torch.bfloat16).name == "mma_a16"
        monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "gemv_cuda")
        assert dispatch.select_kernel(1, w, torch.bfloat16).name == "gemv_a8"  # auto
    finally:
        dispatch._select.cache_clear()


def test_auto_order_with_the_compiled_kernels(monkeypatch) -> None:
    """Where vllm_prism._C holds the CUDA C++ kernels (pretended here), the automatic choice
    takes the CUDA C++ GEMV (gemv_cuda) for M = 1..2 (the GEMV with the producer in its
    launch, gemv_fused_cuda, only where named), mma_small_cuda for M = 3..8, but the
    streaming mma_stream_cuda for M = 3..8 from K = 6144 and for M = 2 past K = 8192, and
    ahead of all three the short-pass mma_lean_cuda for M = 2..8 where K % 512 == 0 (K = 6144
    here, not 256 or 8448), mma_cuda past it up to M = 511 and gemm_dq from M = 512 (bf16
    activations; fp32 ones stay on the int8 kernels); naming a kernel runs it at any M it can
    take (mma_bulk_cuda and mma_persist_cuda, never automatic, up to 16), and the GEMV refuses
    M > 4 and activations too long for its shared memory; with_variant gives a small-batch
    kernel another op variant without changing it."""
    monkeypatch.setattr(dispatch._CudaOpKernel, "is_supported",
                        classmethod(lambda cls, cap: (True, "")))
    w = _interpreted_weight(monkeypatch, "auto")
    gen = torch.Generator().manual_seed(4)
    raw, _, _ = random_ternary(16, 8448, "PQ2_0", gen)
    long_k = PQ2Weight.from_raw(raw, random_signs(8448, gen), 128)
    try:
        chosen = {m: dispatch.select_kernel(m, w, torch.bfloat16).name
                  for m in (1, 2, 3, 4, 8, 9, 16, 64, 511, 512, 4096)}
        assert chosen == {1: "gemv_cuda", 2: "gemv_cuda", 3: "mma_small_cuda",
                          4: "mma_small_cuda",
                          8: "mma_small_cuda", 9: "mma_cuda", 16: "mma_cuda", 64: "mma_cuda",
                          511: "mma_cuda", 512: "gemm_dq", 4096: "gemm_dq"}
        assert dispatch.select_kernel(4096, w, torch.float32).name == "gemm_a8"
        assert [dispatch.select_kernel(m, long_k, torch.bfloat16).name
                for m in (1, 2, 4, 5, 8, 9)] == ["gemv_cuda"] + ["mma_stream_cuda"] * 4 + [
                    "mma_cuda"]
        raw, _, _ = random_ternary(16, 6144, "PQ2_0", gen)
        mid_k = PQ2Weight.from_raw(raw, random_signs(6144, gen), 128)
        assert [dispatch.select_kernel(m, mid_k, torch.bfloat16).name for m in (1, 2, 3, 8, 9)] \
            == ["gemv_cuda"] + ["mma_lean_cuda"] * 3 + ["mma_cuda"]
        # scales it cannot load four at a time (a view one fp16 into wider rows) go to the next
        padded = torch.zeros(mid_k.scales.shape[0], mid_k.scales.shape[1] + 1,
                             dtype=mid_k.scales.dtype)
        padded[:, 1:] = mid_k.scales
        odd = dataclasses.replace(mid_k, scales=padded[:, 1:])
        assert dispatch.select_kernel(3, odd, torch.bfloat16).name == "mma_stream_cuda"
        ok, why = dispatch.MmaLeanCudaA8Kernel.can_implement(
            dispatch.PQ2LinearConfig.of(3, odd, torch.bfloat16))
        assert not ok and "8-byte aligned" in why
        monkeypatch.setattr(dispatch.MmaLeanCudaA8Kernel, "in_auto", False)  # the order behind
        dispatch._select.cache_clear()
        assert [dispatch.select_kernel(m, mid_k, torch.bfloat16).name for m in (2, 3, 8)] \
            == ["gemv_cuda", "mma_stream_cuda", "mma_stream_cuda"]
        monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "gemv_fused_cuda")
        assert dispatch.select_kernel(1, w, torch.bfloat16).name == "gemv_fused_cuda"
        assert dispatch.select_kernel(1, w, torch.float32).name == "gemv_cuda"  # 16-bit x only
        assert dispatch.select_kernel(2, w, torch.bfloat16).name == "gemv_cuda"
        monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "mma_cuda")
        assert dispatch.select_kernel(4096, w, torch.bfloat16).name == "mma_cuda"
        monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "gemv_cuda")
        assert dispatch.select_kernel(4, w, torch.bfloat16).name == "gemv_cuda"
        assert dispatch.select_kernel(5, w, torch.bfloat16).name == "mma_small_cuda"  # auto
        monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "mma_bulk_cuda")  # only where named
        assert dispatch.select_kernel(1, w, torch.bfloat16).name == "mma_bulk_cuda"
        assert dispatch.select_kernel(16, w, torch.bfloat16).name == "mma_bulk_cuda"
        assert dispatch.select_kernel(17, w, torch.bfloat16).name == "mma_cuda"  # auto
        monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "mma_persist_cuda")  # only where named
        assert dispatch.select_kernel(6, w, torch.bfloat16).name == "mma_persist_cuda"
        short = dispatch.MmaStreamCudaA8Kernel.with_variant(3)
        assert (short.variant, short.name, dispatch.MmaStreamCudaA8Kernel.variant) \
            == (3, "mma_stream_cuda", 2) and issubclass(short, dispatch.MmaStreamCudaA8Kernel)
        ok, why = dispatch.GemvCudaA8Kernel.can_implement(dispatch.PQ2LinearConfig(
            m=4, n=16, k=49152, dtype=torch.bfloat16, fmt="PQ2_0", device_type="cuda",
            capability=(9, 0)))
        assert not ok and "shared memory" in why
    finally:
        dispatch._select.cache_clear()


def test_fused_gemv_passes_a_prologue_it_cannot_run_to_the_next_kernel(monkeypatch) -> None:
    """gemv_fused_cuda runs the producer itself: the prologue's features are part of the
    selection, so a per-group norm under 32 values or a residual of another dtype than x goes
    to the next kernel of VLLM_PRISM_PQ2_KERNEL (or of the automatic order) in the one
    selection, with the same result as the producer path; a prologue it can run keeps it."""
    from vllm_prism.kernels.pq2.hadamard import Prologue

    fused = dispatch.GemvFusedCudaKernel
    w = _interpreted_weight(monkeypatch, "auto")
    x = torch.randn(1, w.k).bfloat16()

    def config(pro: Prologue) -> dispatch.PQ2LinearConfig:
        return dispatch.PQ2LinearConfig.of(1, w, x.dtype, pro)
    assert fused.can_implement(config(Prologue(rms_weight=torch.ones(32), rms_group=32)))[0]
    ok, why = fused.can_implement(config(Prologue(rms_weight=torch.ones(16), rms_group=16)))
    assert not ok and "rms_group 16" in why
    ok, why = fused.can_implement(config(Prologue(residual=torch.zeros(1, w.k))))
    assert not ok and "residual is torch.float32" in why
    ok, why = fused.can_implement(config(Prologue(return_input=True)))
    assert not ok and "return_input" in why
    # pretend the fused kernel can run here (it needs vllm_prism._C on a GPU): named first,
    # it is chosen for a prologue it runs and passed over, to the torch reference named
    # next (which runs on the CPU), for one it cannot
    monkeypatch.setattr(fused, "is_supported", classmethod(lambda cls, cap: (True, "")))
    monkeypatch.setenv("VLLM_PRISM_PQ2_KERNEL", "gemv_fused_cuda,torch")
    dispatch._select.cache_clear()
    try:
        ok32 = Prologue(rms_weight=torch.ones(32), rms_group=32)
        assert dispatch.select_kernel(1, w, x.dtype, ok32) is fused
        pro = Prologue(rms_weight=torch.rand(16) + 0.5, rms_group=16)
        assert dispatch.select_kernel(1, w, x.dtype, pro) is dispatch.TorchKernel
        y = dispatch.pq2_linear_fused(x, w, None, pro)[0]
    finally:
        dispatch._select.cache_clear()
    ref = dispatch.TorchKernel.run(dispatch.TorchKernel.make_activation(x, w, pro), w, None,
                                   x.dtype)
    assert torch.equal(y, ref)


def test_gemm_dq_leaves_the_lm_head_to_the_int8_kernels() -> None:
    """The automatic choice gives gemm_dq no matrix whose 16-bit copy would exceed its bound:
    the largest Bonsai 2 projection (34816x5120, 340 MiB) yes, the 248320-row LM head (2.4
    GiB, at M >= 512 for many requests or prompt log-probabilities) no."""
    def config(n: int) -> dispatch.PQ2LinearConfig:
        return dispatch.PQ2LinearConfig(m=512, n=n, k=5120, dtype=torch.bfloat16, fmt="PQ2_0",
                                        device_type="cuda", capability=(9, 0))
    assert dispatch.GemmDqKernel.auto_accepts(config(34816))[0]
    ok, why = dispatch.GemmDqKernel.auto_accepts(config(248320))
    assert not ok and "2425 MiB temporary" in why


def test_fold_prefill_only_where_switched_on(monkeypatch) -> None:
    """From M = 512 the automatic choice keeps the exact gemm_dq unless
    VLLM_PRISM_PQ2_FOLD_PREFILL=1 (wgmma_fold failed the e2e tests' log-prob tolerance on the
    H200); with it, wgmma_fold takes gemm_dq's place where the codes are known to be ternary
    (127 scale levels) on compute capability 9.0, and gemm_dq stays where a 3 occurs (63
    levels), on other GPUs, for the LM head (gemm_dq's matrix bound) and where the plane's
    record cannot be looked up (a fake tensor while tracing); below M = 512 mma_cuda as
    before. The codes are looked up only with the switch on."""
    monkeypatch.setattr(dispatch._CudaOpKernel, "is_supported",
                        classmethod(lambda cls, cap: (True, "")))
    _interpreted_weight(monkeypatch, "auto")
    gen = torch.Generator().manual_seed(5)
    raw, _, _ = random_ternary(16, 1024, "PQ2_0", gen, code3=False)
    ternary = PQ2Weight.from_raw(raw, random_signs(1024, gen), 1024)
    raw, _, _ = random_ternary(16, 1024, "PQ2_0", gen, code3=True)
    with3 = PQ2Weight.from_raw(raw, random_signs(1024, gen), 1024)
    assert ternary.is_ternary() and not with3.is_ternary()

    def chosen(m: int, w: PQ2Weight, dtype: torch.dtype = torch.bfloat16) -> str:
        return dispatch.select_kernel(m, w, dtype).name
    try:
        monkeypatch.delenv("VLLM_PRISM_PQ2_FOLD_PREFILL", raising=False)
        assert [chosen(m, ternary) for m in (511, 512, 4096)] == ["mma_cuda", "gemm_dq",
                                                                  "gemm_dq"]
        assert not dispatch.PQ2LinearConfig.of(512, ternary, torch.bfloat16).ternary
        monkeypatch.setenv("VLLM_PRISM_PQ2_FOLD_PREFILL", "1")
        assert [chosen(m, ternary) for m in (511, 512, 4096)] == ["mma_cuda", "wgmma_fold",
                                                                  "wgmma_fold"]
        assert chosen(512, with3) == "gemm_dq"
        assert chosen(512, ternary, torch.float32) == "gemm_a8"
    finally:
        dispatch._select.cache_clear()
    fold = dispatch.WgmmaFoldKernel

    def config(n: int, cap: tuple[int, int], ternary: bool = True,
               on: bool = True) -> dispatch.PQ2LinearConfig:
        return dispatch.PQ2LinearConfig(m=512, n=n, k=5120, dtype=torch.bfloat16, fmt="PQ2_0",
                                        device_type="cuda", capability=cap, ternary=ternary,
                                        fold_prefill=on)
    assert fold.auto_accepts(config(34816, (9, 0)))[0]
    ok, why = fold.auto_accepts(config(34816, (9, 0), on=False))
    assert not ok and "VLLM_PRISM_PQ2_FOLD_PREFILL" in why
    ok, why = fold.auto_accepts(config(34816, (9, 0), ternary=False))
    assert not ok and "may hold a 3" in why
    ok, why = fold.auto_accepts(config(248320, (9, 0)))
    assert not ok and "MiB temporary" in why
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = dataclasses.replace(ternary, codes=mode.from_tensor(ternary.codes), ternary=None)
        assert not dispatch.PQ2LinearConfig.of(512, fake, torch.bfloat16).ternary
    monkeypatch.undo()  # the real is_supported: sm_90a only
    ok, why = fold.is_supported((8, 9))
    assert not ok and "9.0 only" in why


def test_auto_order_without_the_compiled_kernels(monkeypatch) -> None:
    """Without vllm_prism._C (here: the Triton interpreter): the Triton GEMV up to its rows,
    the Triton int8 tensor-core kernels past them, gemm_dq from M = 512 on bf16."""
    w = _interpreted_weight(monkeypatch, "auto")
    try:
        chosen = {m: dispatch.select_kernel(m, w, torch.bfloat16).name
                  for m in (1, 8, 64, 511, 512)}
        assert chosen == {1: "gemv_a8", 8: "mma_a8", 64: "mma_a8", 511: "gemm_a8",
                          512: "gemm_dq"}
    finally:
        dispatch._select.cache_clear()


def test_gemv_tuning_overrides_the_defaults(monkeypatch) -> None:
    """VLLM_PRISM_GEMV_TUNING replaces only the fields it names; empty keeps the defaults."""
    from vllm_prism.kernels.pq2.triton_gemv import GemvConfig, tuned

    base = GemvConfig(32, 8, 4, block_m=2)
    monkeypatch.setenv("VLLM_PRISM_GEMV_TUNING", "")
    assert tuned(base) is base
    monkeypatch.setenv("VLLM_PRISM_GEMV_TUNING", "depth=3, scales=1,split=4,n=16")
    t = tuned(base)
    assert (t.block_n, t.block_g, t.num_warps, t.block_m, t.depth, t.prefetch_scales,
            t.split_k) == (16, 8, 4, 2, 3, True, 4)
    monkeypatch.setenv("VLLM_PRISM_GEMV_TUNING", "depth=7")
    with pytest.raises(ValueError, match="VLLM_PRISM_GEMV_TUNING='depth=7'.*depth = 7"):
        tuned(base)


def test_ptq1_torch_path_matches_reference() -> None:
    gen = torch.Generator().manual_seed(4)
    raw, _, _ = random_ternary(8, 384, "PTQ1_0", gen)
    w = PTQ1Weight.from_raw(raw)
    x = torch.randn(1, 384, generator=gen)
    bias = torch.randn(8, generator=gen)
    assert rel_err(dispatch.pq2_linear(x, w, bias), reference_linear(x, raw, "PTQ1_0", None,
                                                                     None, bias)) < 1e-6


def test_reference_codec_roundtrip_sanity() -> None:
    # the references used by the kernel tests agree with the numpy codec path
    raw, q, d = random_ternary(3, 256, "PQ2_0", torch.Generator().manual_seed(9))
    q2, d2 = codecs_torch.unpack_blocks(raw, GGMLType.PQ2_0)
    assert torch.equal(q, q2) and torch.equal(d, d2)


def test_ptq1_rows_transcode_to_the_same_planes_in_chunks() -> None:
    """PQ2Weight.from_ptq1_raw (what loading a PTQ1_0 file does, a few rows at a time) gives
    the planes of the PQ2_0 encoding of the same values, whatever the chunk."""
    gen = torch.Generator().manual_seed(9)
    raw, q, d = random_ternary(37, 384, "PTQ1_0", gen)
    s = random_signs(384, gen)
    want = PQ2Weight.from_raw(codecs_torch.pack_blocks(q, d, GGMLType.PQ2_0), s, 128)
    for chunk in (1, 5, 37, 8192):
        got = PQ2Weight.from_ptq1_raw(raw, s, 128, chunk_rows=chunk)
        assert torch.equal(got.codes, want.codes) and torch.equal(got.scales, want.scales)
        assert torch.equal(got.signs, want.signs) and got.hadamard_block == 128
    assert torch.equal(got.dequantize(), dense(raw, "PTQ1_0", torch.float32))


def test_pq2_planes_of_more_rows_than_a_chunk() -> None:
    gen = torch.Generator().manual_seed(10)
    raw, q, d = random_ternary(8192 + 37, 256, "PQ2_0", gen)
    w = PQ2Weight.from_raw(raw)
    assert torch.equal(w.to_raw(), raw)
    uq, ud = w.unpack()
    assert torch.equal(uq, q) and torch.equal(ud, d)
