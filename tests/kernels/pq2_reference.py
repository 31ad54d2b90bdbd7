"""Independent references for the PQ2 kernel tests (no code from vllm_prism.kernels).

Weights are made and decoded with :mod:`vllm_prism.gguf.codecs_torch`, the rotation comes from
:func:`vllm_prism.gguf.hadamard.forward_transform`, and the int8 activation rule is written
out here again from its description (per 128-group, scale = max|x| / 127, round half away
from zero).
"""

from __future__ import annotations

import torch

from vllm_prism.gguf import codecs_torch
from vllm_prism.gguf.constants import GGMLType
from vllm_prism.gguf.hadamard import forward_transform


def random_ternary(n: int, k: int, fmt: str, gen: torch.Generator,
                   device: str = "cpu", code3: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(raw uint8 rows, q int8 [N, K], d fp16 [N, K/128]) on ``device``, drawn on the CPU
    generator ``gen`` and packed on ``device``; PQ2_0 uses all four codes unless ``code3`` is
    False (-1..1 only, as a ternary checkpoint)."""
    hi = 3 if fmt == "PQ2_0" and code3 else 2
    q = torch.randint(-1, hi, (n, k), generator=gen, dtype=torch.int8).to(device)
    d = ((torch.rand(n, k // 128, generator=gen) + 0.5) * 0.05).to(torch.float16).to(device)
    raw = codecs_torch.pack_blocks(q, d, GGMLType[fmt])
    return raw, q, d


def random_signs(k: int, gen: torch.Generator, device: str = "cpu") -> torch.Tensor:
    return torch.where(torch.rand(k, generator=gen) < 0.5, -1.0, 1.0).to(device)


def dense(raw: torch.Tensor, fmt: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return codecs_torch.dequantize(raw, GGMLType[fmt]).to(dtype)


def reference_linear(x: torch.Tensor, raw: torch.Tensor, fmt: str, signs: torch.Tensor | None,
                     block: int | None, bias: torch.Tensor | None = None,
                     dtype: torch.dtype = torch.float64,
                     w_dense: torch.Tensor | None = None) -> torch.Tensor:
    """W_st @ Hblk(s * x) (+ bias) with the exact transform, in ``dtype``.

    ``w_dense`` is ``dense(raw, fmt, dtype)`` when the caller already has it."""
    xt = x.to(dtype)
    if signs is not None:
        xt = forward_transform(xt, signs, block)
    y = xt @ (dense(raw, fmt, dtype) if w_dense is None else w_dense).T
    if bias is not None:
        y = y + bias.to(dtype)
    return y


def quantize_q8(xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-128-group int8 of a transformed activation [M, K]: (q int32, scale fp32 [M, G])."""
    return quantize_q8_blocks(xt, 128)


def quantize_q8_blocks(xt: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 of a transformed activation [M, K] per token and ``block`` of K (the last block
    may be partial), by quantize_q8's rule: (q int32 [M, K], scale fp32 [M, blocks])."""
    m, k = xt.shape
    nb = -(-k // block)
    xp = torch.zeros(m, nb * block, dtype=torch.float32, device=xt.device)
    xp[:, :k] = xt.float()
    xg = xp.reshape(m, nb, block)
    amax = xg.abs().amax(dim=2)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    v = xg * inv.unsqueeze(-1)
    q = torch.sign(v) * torch.floor(v.abs() + 0.5)
    return q.reshape(m, nb * block)[:, :k].to(torch.int32), amax / 127.0


def fold_scales(d: torch.Tensor, groups_per_block: int = 8,
                levels: int = 63) -> torch.Tensor:
    """The group scales [N, G] as the folded kernel uses them (csrc/pq2/wgmma_fold.cuh): in
    each block of ``groups_per_block`` groups, D = max |d| / levels (as 1 / (levels / max)) and
    q = rint(d * levels / max); returns D * q in float64."""
    n, g = d.shape
    nb = -(-g // groups_per_block)
    dp = torch.zeros(n, nb * groups_per_block, dtype=torch.float32, device=d.device)
    dp[:, :g] = d.float()
    db = dp.reshape(n, nb, groups_per_block)
    mx = db.abs().amax(dim=2, keepdim=True)
    inv = torch.where(mx > 0, levels / mx, torch.zeros_like(mx))
    q = torch.round(db * inv)
    dw = torch.where(inv > 0, 1.0 / inv, torch.zeros_like(inv))
    return (dw.double() * q.double()).reshape(n, nb * groups_per_block)[:, :g]


def integer_reference(xq: torch.Tensor, scale: torch.Tensor, q: torch.Tensor, d: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """sum_g d[n, g] * scale[m, g] * sum_j q[n, j] xq[m, j] in float64 (integer sums exact)."""
    m, k = xq.shape
    n = q.shape[0]
    y = torch.zeros(m, n, dtype=torch.float64, device=xq.device)
    for g in range(k // 128):
        sl = slice(128 * g, 128 * (g + 1))
        dot = xq[:, sl].double() @ q[:, sl].double().T  # exact: |sum| < 2**53
        y += dot * scale[:, g:g + 1].double() * d[:, g].double()[None, :]
    if bias is not None:
        y += bias.double()
    return y


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return ((y.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def prologue_reference(x: torch.Tensor, pro, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 (prologue(x), x + residual) of x [M, K] ([M, 2K] with glu), as
    ``vllm_prism.kernels.pq2.hadamard.Prologue`` defines them (the second is x' itself
    without a residual)."""
    v = x.double()
    if pro.glu:
        g, u = v[:, :k], v[:, k:]
        v = g * torch.sigmoid(g) * u
    if pro.residual is not None:
        v = v + pro.residual.double()
    res = v
    if pro.rms_weight is not None:
        w = pro.rms_weight.double() + pro.rms_offset
        if pro.rms_group:
            vg = v.reshape(v.shape[0], -1, pro.rms_group)
            vg = vg * torch.rsqrt(vg.pow(2).mean(-1, keepdim=True) + pro.eps)
            v = (vg * w).reshape(v.shape)
        else:
            v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + pro.eps) * w
    if pro.gate is not None:
        z = pro.gate.double()
        v = v * (torch.sigmoid(z) if pro.gate_sigmoid else z * torch.sigmoid(z))
    return v, res
