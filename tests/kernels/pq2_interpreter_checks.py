"""Run every PQ2 Triton kernel under the Triton CPU interpreter on tiny shapes.

Started by test_pq2_interpreter.py in a subprocess with TRITON_INTERPRET=1 (Triton reads it
when the kernels are defined, so it cannot be switched on inside a running test session).
Prints one JSON object: check name -> {"ok": bool, "detail": str}.

Tolerances: kernels are compared with a reference built from the activation they consumed
(so the interpreter's fp32->bf16 conversion, which truncates instead of rounding, does not
count against them); fp32 outputs: 1e-5 relative. The producer is compared with
forward_transform: bit-exact in fp32, within one bf16 step in bf16, the int8 layouts with
the independent quantizer of pq2_reference (codes within 1, scales to 1e-6).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from pq2_reference import (dense, integer_reference, quantize_q8, random_signs,  # noqa: E402
                           random_ternary, rel_err)

from vllm_prism.gguf.hadamard import forward_transform  # noqa: E402
from vllm_prism.kernels.pq2 import dispatch  # noqa: E402
from vllm_prism.kernels.pq2.hadamard import (ActKind, Prologue, transform_activation,  # noqa: E402
                                             transform_activation_torch)
from vllm_prism.kernels.pq2.layout import PQ2Weight, PTQ1Weight  # noqa: E402
from vllm_prism.kernels.pq2.triton_gemv import gemv_a8, gemv_a16  # noqa: E402
from vllm_prism.kernels.pq2.triton_mma import TCConfig, pq2_tc_linear  # noqa: E402

SHAPES = [(64, 256, 64), (37, 384, 128)]  # (N, K, Hadamard block)
MS = [1, 3, 17, 130]
RESULTS: dict[str, dict] = {}


def check(name: str):
    def deco(fn):
        try:
            detail = fn()
            RESULTS[name] = {"ok": True, "detail": detail or ""}
        except Exception:  # report, keep going
            RESULTS[name] = {"ok": False, "detail": traceback.format_exc()[-1500:]}
        return fn
    return deco


def case(n: int, k: int, block: int, fmt: str = "PQ2_0"):
    gen = torch.Generator().manual_seed(n + k)
    raw, q, d = random_ternary(n, k, fmt, gen)
    signs = random_signs(k, gen)
    cls = PQ2Weight if fmt == "PQ2_0" else PTQ1Weight
    return raw, q, d, signs, cls.from_raw(raw, signs, block)


def q8_of(act) -> torch.Tensor:
    return act.data.int()


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


for n, k, block in SHAPES:
    raw, q, d, signs, w = case(n, k, block)
    wd = dense(raw, "PQ2_0")
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5))
    for m in MS:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        tag = f"{n}x{k}-b{block}-m{m}"

        @check(f"producer-{tag}")
        def _producer():
            xf = x.float()
            ref = forward_transform(xf, signs, block)
            got = transform_activation(xf, signs, block, ActKind.FLOAT).data
            expect(torch.equal(got, ref), "fp32 FLOAT not bit-exact")
            gb = transform_activation(x, signs, block, ActKind.FLOAT).data.float()
            rb = forward_transform(x, signs, block).float()
            expect(((gb - rb).abs() <= rb.abs() * 2 ** -7 + 1e-30).all(), "bf16 FLOAT off")
            qr, sr = quantize_q8(forward_transform(x.float(), signs, block))
            a = transform_activation(x, signs, block, ActKind.Q8)
            expect((q8_of(a) - qr).abs().max().item() <= 1, "Q8 codes")
            expect(torch.allclose(a.group_scale, sr, rtol=1e-6, atol=0), "scales")
            expect(torch.equal(a.group_sum, q8_of(a).reshape(m, -1, 128).sum(-1)), "sums")
            a = transform_activation(x, signs, block, ActKind.F32_PERM)
            xt = forward_transform(x.float(), signs, block)
            slot = torch.arange(16)  # slot 4b + q holds element 4q + b scaled by 4**-(4(b%2)+q)
            b, q = slot // 4, slot % 4
            unscaled = a.data * torch.exp2(2.0 * (4 * (b % 2) + q))[None, :, None]
            got = torch.empty(m, k // 16, 16)
            got[:, :, 4 * q + b] = unscaled.transpose(1, 2)
            expect(torch.equal(got.reshape(m, k), xt), "F32_PERM layout")

        for name in dispatch.KERNELS:
            kname = name.name
            if kname in ("torch", "ptq1_gemv"):
                continue
            c = dispatch.PQ2LinearConfig.of(m, w, x.dtype)
            if not (name.is_supported(c.capability)[0] and name.can_implement(c)[0]):
                continue  # e.g. the CUDA C++ kernel: GPU tests only

            @check(f"{kname}-{tag}")
            def _kernel(kernel=name):
                act = kernel.make_activation(x, w)
                y = kernel.run(act, w, bias, torch.float32)
                if act.kind == ActKind.Q8:
                    ref = integer_reference(q8_of(act), act.group_scale, q, d, bias)
                elif act.kind == ActKind.F32_PERM:
                    ref = forward_transform(x.double(), signs, block) @ wd.T + bias.double()
                else:
                    ref = act.data.double() @ wd.T + bias.double()
                err = rel_err(y, ref)
                # gemm_dq multiplies in bf16 (weights rounded to it); the others are exact
                # up to fp32 sums
                expect(err < (1e-2 if kernel.name == "gemm_dq" else 1e-5),
                       f"relative error {err:.2e}")
                return f"{err:.1e}"

        @check(f"pq2_linear-{tag}")
        def _auto():
            y = dispatch.pq2_linear(x, w)
            ref = forward_transform(x.double(), signs, block) @ wd.T
            err = rel_err(y, ref)
            expect(y.dtype == torch.bfloat16 and err < 3e-2, f"relative error {err:.2e}")
            return f"{dispatch.select_kernel(m, w, x.dtype).name} {err:.1e}"


@check("split-k-and-tiles")
def _split():
    raw, q, d, signs, w = case(40, 1024, 1024)
    x = torch.randn(5, 1024).to(torch.float16)
    wd = dense(raw, "PQ2_0")
    af = transform_activation(x, signs, 1024, ActKind.FLOAT)
    aq = transform_activation(x, signs, 1024, ActKind.Q8)
    for cfg in (TCConfig(16, 16, 3), TCConfig(64, 32, 8), TCConfig(32, 16, 1, fold_scale=True)):
        y = pq2_tc_linear(af, w, None, torch.float32, cfg)
        expect(rel_err(y, af.data.double() @ wd.T) < 1e-5, f"a16 {cfg}")
        y = pq2_tc_linear(aq, w, None, torch.float32, cfg)
        expect(rel_err(y, integer_reference(q8_of(aq), aq.group_scale, q, d)) < 1e-5,
               f"a8 {cfg}")


@check("gemv-ragged-groups")
def _ragged():
    from vllm_prism.kernels.pq2.triton_gemv import GemvConfig

    raw, q, d, signs, w = case(19, 640, 128)  # 5 groups: not a multiple of the tile
    x = torch.randn(1, 640).to(torch.bfloat16)
    wd = dense(raw, "PQ2_0")
    a8 = transform_activation(x, signs, 128, ActKind.Q8)
    y = gemv_a8(a8, w, None, torch.float32, GemvConfig(8, 4, 2))
    expect(rel_err(y, integer_reference(q8_of(a8), a8.group_scale, q, d)) < 1e-5, "a8")
    x5 = torch.randn(5, 640).to(torch.bfloat16)  # 5 rows, tiles of 4: a masked row tile
    a8 = transform_activation(x5, signs, 128, ActKind.Q8)
    y = gemv_a8(a8, w, None, torch.float32, GemvConfig(8, 4, 2, block_m=4))
    expect(rel_err(y, integer_reference(q8_of(a8), a8.group_scale, q, d)) < 1e-5, "a8 rows")
    a16 = transform_activation(x, signs, 128, ActKind.F32_PERM)
    y = gemv_a16(a16, w, None, torch.float32, GemvConfig(8, 4, 2))
    expect(rel_err(y, forward_transform(x.double(), signs, 128) @ wd.T) < 1e-5, "a16")


@check("dequantize-planes")
def _dequant():
    """The one-pass dequantization of the prepared planes (gemm_dq) against the planes'
    own unpacking: exact in fp32, within one bf16 step in bf16 (the interpreter truncates)."""
    from vllm_prism.kernels.pq2.triton_dequant import dequantize_pq2

    raw, q, d, signs, w = case(21, 1152, 128)  # 9 groups, 72 words: a ragged word tile
    want = dense(raw, "PQ2_0").float()
    expect(torch.equal(dequantize_pq2(w, torch.float32), want), "fp32 not exact")
    got = dequantize_pq2(w, torch.bfloat16).float()
    expect(((got - want).abs() <= want.abs() * 2 ** -7).all(), "bf16 off by more than a step")


@check("fp8-operands")
def _fp8_operands():
    """gemm_fp8's two Triton passes: the codes as e4m3 times their transposed float32 scales
    equal the GGUF codec's weights exactly; the activation's 1x128 scales are each group's
    absmax / 448 (outer-dimension-major), and its e4m3 values of the sign of x / scale and
    within half of it: the interpreter's fp32 -> e4m3 conversion drops values with a mantissa
    near 2 to the power of two below (-127.9 -> -64), so the rounding itself is checked on
    the GPU (test_pq2_fp8_gemm.py: equal to torch's round-to-nearest)."""
    from vllm_prism.kernels.pq2.triton_fp8 import pq2_codes_fp8, quantize_fp8_1x128

    raw, q, d, signs, w = case(21, 1152, 128)  # 9 groups: a ragged word tile
    codes, scales = pq2_codes_fp8(w)
    expect(codes.dtype == torch.float8_e4m3fn and scales.shape == (9, 21), "layout")
    got = codes.float() * scales.t().repeat_interleave(128, 1)
    expect(torch.equal(got, dense(raw, "PQ2_0").float()), "codes x scales not exact")
    x = torch.randn(19, 1152, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x[4, 128:256] = 0  # an all-zero group keeps a finite scale
    xq, xs = quantize_fp8_1x128(x)
    expect(xs.shape == (19, 9) and xs.stride() == (1, 19), f"scale layout {xs.stride()}")
    groups = x.float().view(19, 9, 128)
    amax = groups.abs().amax(-1)
    want_s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    expect(torch.allclose(xs, want_s, rtol=1e-6, atol=0), "scales")
    scaled = groups / want_s[..., None]
    got = xq.float().view(19, 9, 128)
    step = torch.exp2(torch.floor(torch.log2(scaled.abs().clamp(min=2.0 ** -6))) - 3)
    err = (got - scaled).abs()
    expect(bool((err <= scaled.abs() / 2 + step).all()), "e4m3 values off by more than half")
    expect(bool((got * scaled >= 0).all()) and got.abs().max() <= 448, "signs or range")
    pq, ps = quantize_fp8_1x128(x, 16)  # padded to 32 rows for cuBLAS
    expect(pq.shape == (32, 1152) and ps.shape == (32, 9) and ps.stride() == (1, 32), "pad")
    expect(torch.equal(pq[:19].float(), xq.float()) and torch.equal(ps[:19], xs), "pad rows")
    expect(not pq[19:].float().any() and bool((ps[19:] == 1).all()), "padding not zero")
    return f"act rel err {rel_err(got * xs[..., None], groups):.3g} (interpreter rounding)"


@check("gemv-split-k")
def _gemv_split():
    """K split over programs (ragged: 9 groups in 3 splits of 4, 4, 1; even: 16 in 4), with
    bias, 3 rows, prefetch on and off: the partials of every tile are added once, by its last
    program, which resets its counter (a second call must give the same result)."""
    from vllm_prism.kernels.pq2.triton_gemv import GemvConfig, _split_counters

    for k, split in ((1152, 3), (2048, 4)):
        raw, q, d, signs, w = case(19, k, 128)
        x = torch.randn(3, k).to(torch.bfloat16)
        bias = torch.randn(19)
        a8 = transform_activation(x, signs, 128, ActKind.Q8)
        ref = integer_reference(q8_of(a8), a8.group_scale, q, d, bias)
        for depth, ahead in ((1, False), (2, True)):
            cfg = GemvConfig(8, 2, 2, block_m=4, depth=depth, prefetch_scales=ahead,
                             split_k=split)
            for call in range(2):
                y = gemv_a8(a8, w, bias, torch.float32, cfg)
                expect(rel_err(y, ref) < 1e-5, f"K={k} {cfg} call {call}: "
                       f"{rel_err(y, ref):.1e}")
            expect(not _split_counters(w.device).any(), f"K={k} {cfg}: counters not reset")


@check("gemv-prefetch-depths")
def _gemv_depths():
    """Tiles in flight 1..3 ahead, scales with them or not, over 9 groups in tiles of 2 (a
    ragged last tile, prefetches past the end): each tile must be reduced once, in order."""
    from vllm_prism.kernels.pq2.triton_gemv import GemvConfig

    raw, q, d, signs, w = case(19, 1152, 128)
    x = torch.randn(3, 1152).to(torch.bfloat16)
    a8 = transform_activation(x, signs, 128, ActKind.Q8)
    ref = integer_reference(q8_of(a8), a8.group_scale, q, d)
    for depth in (1, 2, 3):
        for ahead in (False, True):
            cfg = GemvConfig(8, 2, 2, block_m=4, depth=depth, prefetch_scales=ahead)
            y = gemv_a8(a8, w, None, torch.float32, cfg)
            expect(rel_err(y, ref) < 1e-5, f"{cfg}: {rel_err(y, ref):.1e}")


@check("ptq1-gemv")
def _ptq1():
    for n, k, block in ((37, 640, 128), (16, 1024, 1024)):
        raw, q, d, signs, w = case(n, k, block, "PTQ1_0")
        x = torch.randn(1, k).to(torch.bfloat16)
        kern = dispatch._BY_NAME["ptq1_gemv"]
        y = kern.run(kern.make_activation(x, w), w, None, torch.float32)
        ref = forward_transform(x.double(), signs, block) @ dense(raw, "PTQ1_0").T
        expect(rel_err(y, ref) < 1e-5, f"{n}x{k}: {rel_err(y, ref):.1e}")
        expect(torch.equal(w.as_pq2().dequantize(), dense(raw, "PTQ1_0", torch.float32)),
               "PQ2 copy")


@check("rmsnorm-fused")
def _rms():
    k = 512
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, k, generator=gen)
    g = torch.rand(k, generator=gen) + 0.5
    s = random_signs(k, gen)
    xn = x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-6) * g
    got = transform_activation(x, s, 256, ActKind.FLOAT,
                               prologue=Prologue(rms_weight=g)).data
    err = rel_err(got, forward_transform(xn.double(), s, 256))
    expect(err < 1e-6, f"{err:.1e}")


@check("prologue-fused")
def _prologue():
    """SiLU-and-multiply, residual add and the (1 + w) RMSNorm in the producer launch, against
    the same steps in separate torch ops (fp32, then bf16 with the residual written back)."""
    k = 384
    gen = torch.Generator().manual_seed(4)
    s = random_signs(k, gen)
    gu = torch.randn(3, 2 * k, generator=gen)
    x, r = torch.randn(3, k, generator=gen), torch.randn(3, k, generator=gen)
    g = torch.rand(k, generator=gen) - 0.5
    act = transform_activation(gu, s, 128, ActKind.FLOAT, prologue=Prologue(glu=True))
    want = torch.nn.functional.silu(gu[:, :k].double()) * gu[:, k:].double()
    err = rel_err(act.data, forward_transform(want, s, 128))
    expect(err < 1e-6, f"glu {err:.1e}")
    pro = Prologue(residual=r, rms_weight=g, rms_offset=1.0, eps=1e-6)
    act = transform_activation(x, s, 128, ActKind.FLOAT, prologue=pro)
    xs = x.double() + r.double()
    xn = xs * torch.rsqrt(xs.pow(2).mean(dim=1, keepdim=True) + 1e-6) * (1.0 + g.double())
    err = rel_err(act.data, forward_transform(xn, s, 128))
    expect(err < 1e-6, f"add-rmsnorm {err:.1e}")
    expect(torch.allclose(act.residual.double(), xs, rtol=1e-6, atol=1e-6), "residual out")
    xb, rb = x.bfloat16(), r.bfloat16()
    pro_b = Prologue(residual=rb, rms_weight=g.bfloat16(), rms_offset=1.0)
    for kind in (ActKind.Q8, ActKind.F32_PERM):
        got = transform_activation(xb, s, 128, kind, prologue=pro_b)
        ref = transform_activation_torch(xb, s, 128, kind, prologue=pro_b)
        rsum = xb.float() + rb.float()  # bf16 store: one step (the interpreter truncates)
        expect(got.residual.dtype == torch.bfloat16 and
               ((got.residual.float() - rsum).abs() <= rsum.abs() * 2 ** -7).all(),
               f"{kind.name} residual out")
        if kind == ActKind.Q8:
            expect((got.data.int() - ref.data.int()).abs().max() <= 1, "Q8 codes")
            expect(torch.allclose(got.group_scale, ref.group_scale, rtol=1e-5), "Q8 scales")
        else:
            expect(rel_err(got.data, ref.data) < 1e-6, "F32_PERM")
    # the Gated DeltaNet's gated per-head norm (heads of 64) and the attention's sigmoid gate
    z = torch.randn(3, k, generator=gen)
    w64 = torch.rand(64, generator=gen) + 0.5
    act = transform_activation(x, s, 128, ActKind.FLOAT,
                               prologue=Prologue(rms_weight=w64, rms_group=64, gate=z))
    xh = x.double().reshape(3, -1, 64)
    xh = xh * torch.rsqrt(xh.pow(2).mean(dim=-1, keepdim=True) + 1e-6) * w64.double()
    want = xh.reshape(3, k) * torch.nn.functional.silu(z.double())
    err = rel_err(act.data, forward_transform(want, s, 128))
    expect(err < 1e-6, f"gated per-head norm {err:.1e}")
    act = transform_activation(x, s, 128, ActKind.Q8, prologue=Prologue(gate=z,
                                                                          gate_sigmoid=True))
    ref = transform_activation_torch(x, s, 128, ActKind.Q8,
                                     prologue=Prologue(gate=z, gate_sigmoid=True))
    want = forward_transform(x.double() * torch.sigmoid(z.double()), s, 128)
    expect(rel_err(transform_activation_torch(x, s, 128, ActKind.FLOAT, prologue=Prologue(
        gate=z, gate_sigmoid=True)).data, want) < 1e-6, "sigmoid gate (torch)")
    expect((act.data.int() - ref.data.int()).abs().max() <= 1, "sigmoid gate Q8 codes")


@check("prologue-return-input")
def _return_input():
    """The normalized input returned beside the Q8 activation (the Gated DeltaNet's in_proj_ba
    reads it): a row of 1,536 values, whose norm sums two chunks, the second one masked."""
    k = 1536
    gen = torch.Generator().manual_seed(5)
    s = random_signs(k, gen)
    x, r = torch.randn(2, k, generator=gen), torch.randn(2, k, generator=gen)
    g = torch.rand(k, generator=gen) - 0.5
    pro = Prologue(residual=r, rms_weight=g, rms_offset=1.0, eps=1e-6, return_input=True)
    xs = x.double() + r.double()
    xn = xs * torch.rsqrt(xs.pow(2).mean(dim=1, keepdim=True) + 1e-6) * (1.0 + g.double())
    act = transform_activation(x, s, 128, ActKind.Q8, prologue=pro)
    ref = transform_activation_torch(x, s, 128, ActKind.Q8, prologue=pro)
    expect(act.linear_input is not None and act.linear_input.dtype == torch.float32,
           "linear_input returned in x's dtype")
    err = rel_err(act.linear_input, xn)
    expect(err < 1e-6, f"linear_input {err:.1e}")
    expect(rel_err(ref.linear_input, xn) < 1e-6, "linear_input (torch)")
    expect((act.data.int() - ref.data.int()).abs().max() <= 1, "Q8 codes beside it")
    plain = transform_activation(x, s, 128, ActKind.Q8, prologue=Prologue(
        residual=r, rms_weight=g, rms_offset=1.0, eps=1e-6))
    expect(plain.linear_input is None and torch.equal(plain.data, act.data),
           "same codes without return_input")
    xb = transform_activation(x.bfloat16(), s, 128, ActKind.Q8, prologue=Prologue(
        residual=r.bfloat16(), rms_weight=g, rms_offset=1.0, return_input=True)).linear_input
    xbn = x.bfloat16().double() + r.bfloat16().double()
    xbn = xbn * torch.rsqrt(xbn.pow(2).mean(dim=1, keepdim=True) + 1e-6) * (1.0 + g.double())
    expect(xb.dtype == torch.bfloat16 and rel_err(xb, xbn) < 2 ** -7, "bf16 linear_input")


if __name__ == "__main__":
    json.dump(RESULTS, sys.stdout)
