"""The activation producer of the PQ2 kernels: prologue -> signs -> block Hadamard -> layout.

A folded Bonsai linear layer computes ``y = W_st @ Hblk(s * x)``. One Triton kernel reads the
activation once and writes it in the form the chosen weight kernel consumes, so the rotation
costs no extra pass. A :class:`Prologue` fuses what feeds the linear in the model into the
same launch: the SiLU-and-multiply of a gated MLP (``glu``: x is ``[M, 2K]``), the residual
add (the fp32 sum is normalized and written back in the residual's dtype, as vLLM's fused
add-norm does), an RMSNorm (``rms_weight``, with ``rms_offset`` 1.0 for the zero-centred ``(1 + w)``
norm of Qwen3.5; ``rms_group`` normalizes every group of that many elements on its own, the
per-head norm of the Gated DeltaNet output) and an output gate (``gate``: times ``silu(gate)``,
or ``sigmoid(gate)`` with ``gate_sigmoid``; the attention output gate and the gated norm's
gate), all in fp32. With ``return_input`` it also stores the prologue's result in x's dtype
(the normalized input that a float projection beside the linear reads: the Gated DeltaNet's
``in_proj_ba``), so the norm needs no launch of its own. Then it multiplies by the sign
vector, runs the normalized Walsh-Hadamard butterfly on each ``block``-chunk in fp32 (same
operation order as :func:`vllm_prism.gguf.hadamard.forward_transform`) and stores one of

* ``FLOAT``: ``[M, K]`` in the requested dtype (the standalone transform, the bf16/fp16
  tensor-core kernels, the PTQ1 GEMV with fp32);
* ``F32_PERM``: fp32 ``[M, 16, K/16]`` with ``data[m, 4b + q, w] = x[m, 16w + 4q + b] *
  4**-(4 * (b % 2) + q)``, plus the fp32 sum of every 128-group: the float GEMV multiplies
  the masked, unshifted code field of element ``16w + 4q + b`` (bits ``8b + 2q`` of the word,
  or of the word shifted right by 16 for ``b >= 2``) by it;
* ``Q8``: int8 ``[M, K]`` quantized per 128-group (``scale = max|x| / 127``, round half away
  from zero), with the fp32 scale and the int32 sum of the codes of every group (the int8
  GEMV and tensor-core kernels read it in this natural order).

Without signs the kernel only (normalizes and) re-lays out the activation. ``RAW`` names no
layout of this kernel: x and the :class:`Prologue` as they are, for a weight kernel that runs
the producer inside its own launch (``gemv_fused_cuda``, csrc/pq2/gemv_int8.cu).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

from vllm_prism.kernels.common import HAS_TRITON, pdl_launch, triton_can_run, use_pdl

if HAS_TRITON:
    import triton
    import triton.language as tl

    from vllm_prism.kernels.common import pdl_release, pdl_wait

__all__ = ["ActKind", "PQ2Activation", "Prologue", "check_activation", "transform_activation",
           "hadamard_transform", "transform_activation_torch", "quantize_int8_groups",
           "block_hadamard_torch", "signed_hadamard_torch", "inverse_signed_hadamard_torch"]

GROUP = 128
_MAX_SEG = 1024


class ActKind(enum.IntEnum):
    """Layouts the producer writes (see the module docstring)."""

    FLOAT = 0
    F32_PERM = 1
    Q8 = 2
    RAW = 3  # x itself, with the prologue: for a kernel that runs the producer in its launch


@dataclass(frozen=True)
class Prologue:
    """What the producer computes before the signs: ``glu`` (x is ``[M, 2K]``, the input is
    ``silu(x[:, :K]) * x[:, K:]``), then ``+ residual`` (the sum is returned), then the
    RMSNorm ``x * rsqrt(mean(x^2) + eps) * (rms_offset + rms_weight)`` over the row, or over
    each ``rms_group`` elements (``rms_weight`` then has ``rms_group`` values), then
    ``* act(gate)`` (``gate`` [M, K]; act: silu, or sigmoid with ``gate_sigmoid``).
    ``return_input`` also returns that result (the linear's input before the signs) in x's
    dtype."""

    glu: bool = False
    residual: torch.Tensor | None = None
    rms_weight: torch.Tensor | None = None
    rms_offset: float = 0.0
    eps: float = 1e-6
    rms_group: int = 0
    gate: torch.Tensor | None = None
    gate_sigmoid: bool = False
    return_input: bool = False  # also return the result above in x's dtype (``linear_input``)


NO_PROLOGUE = Prologue()


@dataclass
class PQ2Activation:
    """A transformed activation in one of the :class:`ActKind` layouts.

    ``group_scale`` (fp32 ``[M, K/128]``) is set for the Q8 kinds; ``group_sum`` holds the
    int32 code sums (Q8 kinds) or the fp32 value sums (F32_PERM) of every 128-group.
    """

    kind: ActKind
    data: torch.Tensor
    m: int
    k: int
    dtype: torch.dtype
    group_scale: torch.Tensor | None = None
    group_sum: torch.Tensor | None = None
    residual: torch.Tensor | None = None  # x + residual, when the prologue adds one
    prologue: Prologue | None = None  # RAW: what the kernel computes before the signs
    linear_input: torch.Tensor | None = None  # the prologue's result, for ``return_input``


# ------------------------------------------------------------------------------ Triton

if HAS_TRITON:

    @triton.jit
    def _fwht(x, SEG: tl.constexpr, LOG_B: tl.constexpr):
        """Unnormalized Walsh-Hadamard butterflies on every 2**LOG_B chunk of x [SEG]."""
        for s in tl.static_range(LOG_B):
            y = tl.reshape(x, (SEG // (2 << s), 2, 1 << s))
            y = tl.permute(y, (0, 2, 1))
            a, b = tl.split(y)
            y = tl.join(a + b, a - b)
            y = tl.permute(y, (0, 2, 1))
            x = tl.reshape(y, (SEG,))
        return x

    @triton.jit
    def _prologue_load(x_row, r_row, o, mask, K,
                       GLU: tl.constexpr, HAS_RES: tl.constexpr):
        """fp32 values at offsets o of one row: silu(gate) * up, plus the residual."""
        if GLU:
            g = tl.load(x_row + o, mask=mask, other=0.0).to(tl.float32)
            u = tl.load(x_row + K + o, mask=mask, other=0.0).to(tl.float32)
            v = g / (1.0 + tl.exp(-g)) * u
        else:
            v = tl.load(x_row + o, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            r = tl.load(r_row + o, mask=mask, other=0.0).to(tl.float32)
            v = v + r
        return v

    @triton.jit
    def _act_kernel(x_ptr, res_ptr, resout_ptr, signs_ptr, rmsw_ptr, gate_ptr, xout_ptr,
                    out_ptr, gscale_ptr, gsum_ptr, K, stride_xm, stride_rm, stride_zm,
                    stride_om, stride_gm, eps, rms_offset,
                    SEG: tl.constexpr, LOG_B: tl.constexpr, INV_SQRT_B: tl.constexpr,
                    HAS_SIGNS: tl.constexpr, HAS_RMS: tl.constexpr, RMS_BLOCK: tl.constexpr,
                    RMS_STEPS: tl.constexpr, HAS_XOUT: tl.constexpr,
                    RMS_GROUP: tl.constexpr, GLU: tl.constexpr, HAS_RES: tl.constexpr,
                    HAS_GATE: tl.constexpr, GATE_SIGMOID: tl.constexpr, MODE: tl.constexpr,
                    PDL: tl.constexpr = False):
        pdl_release(PDL)  # let the next kernel launch
        m = tl.program_id(0).to(tl.int64)
        seg = tl.program_id(1)
        NG: tl.constexpr = SEG // 128
        offs = seg * SEG + tl.arange(0, SEG)
        # the fold's signs and the norm's weight are the model's constants: their loads go out
        # while the kernel before this one finishes
        if HAS_SIGNS:
            sgn = tl.load(signs_ptr + offs)
        if HAS_RMS:
            if RMS_GROUP > 0:
                rmsw = tl.load(rmsw_ptr + offs % RMS_GROUP).to(tl.float32) + rms_offset
            else:
                rmsw = tl.load(rmsw_ptr + offs).to(tl.float32) + rms_offset
        pdl_wait(PDL)  # our inputs are complete past here
        x_row = x_ptr + m * stride_xm
        r_row = res_ptr + m * stride_rm
        x = _prologue_load(x_row, r_row, offs, offs < K, K, GLU, HAS_RES)
        if HAS_RES:
            tl.store(resout_ptr + m * K + offs, x.to(resout_ptr.dtype.element_ty))
        if HAS_RMS:
            if RMS_GROUP > 0:  # each group of RMS_GROUP elements on its own (per head)
                xg = tl.reshape(x, (SEG // RMS_GROUP, RMS_GROUP))
                rg = 1.0 / tl.sqrt(tl.sum(xg * xg, axis=1) / RMS_GROUP + eps)
                x = tl.reshape(xg * rg[:, None], (SEG,))
                x = x * rmsw
            else:
                # unrolled: every chunk's loads are issued before the first is summed (a
                # runtime loop waits for each chunk's L2 round trip in turn)
                sq = tl.zeros([RMS_BLOCK], dtype=tl.float32)
                for i in tl.static_range(RMS_STEPS):
                    o = i * RMS_BLOCK + tl.arange(0, RMS_BLOCK)
                    v = _prologue_load(x_row, r_row, o, o < K, K, GLU, HAS_RES)
                    sq += v * v
                rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / K + eps)
                x = x * rstd * rmsw
        if HAS_GATE:
            z = tl.load(gate_ptr + m * stride_zm + offs).to(tl.float32)
            sig = 1.0 / (1.0 + tl.exp(-z))
            x = x * (sig if GATE_SIGMOID else z * sig)
        if HAS_XOUT:
            tl.store(xout_ptr + m * K + offs, x.to(xout_ptr.dtype.element_ty))
        if HAS_SIGNS:
            x = x * sgn
        if LOG_B > 0:
            x = _fwht(x, SEG, LOG_B) * INV_SQRT_B
        out_row = out_ptr + m * stride_om
        g_offs = seg * NG + tl.arange(0, NG)
        if MODE == 0:  # FLOAT
            tl.store(out_row + offs, x.to(out_ptr.dtype.element_ty))
        elif MODE == 1:  # F32_PERM
            q = (offs >> 2) & 3
            b = offs & 3
            scale = ((127 - 2 * (4 * (b & 1) + q)) << 23).to(tl.float32, bitcast=True)
            tl.store(out_row + (4 * b + q) * (K // 16) + (offs >> 4), x * scale)
            xs = tl.sum(tl.reshape(x, (NG, 128)), axis=1)
            tl.store(gsum_ptr + m * stride_gm + g_offs, xs)
        else:  # Q8
            xg = tl.reshape(x, (NG, 128))
            amax = tl.max(tl.abs(xg), axis=1)
            inv = tl.where(amax > 0, 127.0 / amax, 0.0)
            v = xg * inv[:, None]
            qa = (tl.abs(v) + 0.5).to(tl.int32)
            qa = tl.minimum(qa, 127)
            q = tl.where(v < 0, -qa, qa)
            tl.store(gscale_ptr + m * stride_gm + g_offs, amax / 127.0)
            tl.store(gsum_ptr + m * stride_gm + g_offs, tl.sum(q, axis=1))
            tl.store(out_row + offs, tl.reshape(q, (SEG,)).to(tl.int8))


def _segment(k: int, block: int, group: int = 0) -> int:
    """Elements per program: a power of two >= max(block, 128, group) dividing K, <= 1024 if
    possible."""
    seg = max(block, GROUP, group)
    while seg < _MAX_SEG and k % (2 * seg) == 0:
        seg *= 2
    return seg


def check_activation(x: torch.Tensor, signs: torch.Tensor | None, block: int | None,
                     pro: Prologue = NO_PROLOGUE) -> int:
    """Checks x [M, K] (``[M, 2K]`` for a glu prologue), the fold and the prologue's tensors
    as the producer needs them (ValueError naming what is wrong); returns the Hadamard block
    (1 without signs)."""
    if x.dim() != 2:
        raise ValueError(f"activation must be 2-D [M, K], got shape {tuple(x.shape)}")
    k = x.shape[1] // 2 if pro.glu else x.shape[1]
    if pro.glu and x.shape[1] % 2:
        raise ValueError(f"a gated (glu) input has an even width, got {x.shape[1]}")
    if pro.residual is not None and tuple(pro.residual.shape) != (x.shape[0], k):
        raise ValueError(f"residual has shape {tuple(pro.residual.shape)}, expected "
                         f"{(x.shape[0], k)}")
    if pro.rms_group and (pro.rms_group & (pro.rms_group - 1) or k % pro.rms_group
                          or pro.rms_group > _MAX_SEG):
        raise ValueError(f"rms_group must be a power of two <= {_MAX_SEG} dividing K = {k}, "
                         f"got {pro.rms_group}")
    width = pro.rms_group or k
    if pro.rms_weight is not None and pro.rms_weight.numel() != width:
        raise ValueError(f"rms_weight has {pro.rms_weight.numel()} values, expected {width}")
    if pro.gate is not None and (tuple(pro.gate.shape) != (x.shape[0], k)
                                 or pro.gate.stride(-1) != 1):
        raise ValueError(f"gate must be [M, K] = {(x.shape[0], k)} with unit column stride, "
                         f"got shape {tuple(pro.gate.shape)}")
    if k % GROUP:
        raise ValueError(f"K = {k} is not a multiple of {GROUP}")
    b = 1 if block is None else int(block)
    if b <= 0 or b & (b - 1) or k % b:
        raise ValueError(f"Hadamard block must be a power of two dividing K = {k}, got {block}")
    if signs is not None and signs.numel() != k:
        raise ValueError(f"signs has {signs.numel()} values, expected K = {k}")
    if (signs is None) != (block is None):
        raise ValueError("signs and block must be given together")
    return b


def _alloc(kind: ActKind, m: int, k: int, dtype: torch.dtype,
           device: torch.device) -> PQ2Activation:
    g = k // GROUP
    if kind == ActKind.FLOAT:
        data = torch.empty(m, k, dtype=dtype, device=device)
        return PQ2Activation(kind, data, m, k, dtype)
    if kind == ActKind.F32_PERM:
        data = torch.empty(m, 16, k // 16, dtype=torch.float32, device=device)
        gsum = torch.empty(m, g, dtype=torch.float32, device=device)
        return PQ2Activation(kind, data, m, k, dtype, None, gsum)
    data = torch.empty(m, k, dtype=torch.int8, device=device)
    scale = torch.empty(m, g, dtype=torch.float32, device=device)
    qsum = torch.empty(m, g, dtype=torch.int32, device=device)
    return PQ2Activation(kind, data, m, k, dtype, scale, qsum)


def transform_activation(x: torch.Tensor, signs: torch.Tensor | None, block: int | None,
                         kind: ActKind = ActKind.FLOAT, *, out_dtype: torch.dtype | None = None,
                         prologue: Prologue = NO_PROLOGUE) -> PQ2Activation:
    """``Hblk(signs * prologue(x))`` of x [M, K] (``[M, 2K]`` for a glu prologue) in the
    layout ``kind``, one Triton launch.

    ``out_dtype`` (FLOAT only) defaults to x's dtype. Falls back to
    :func:`transform_activation_torch` where Triton cannot run.
    """
    b = check_activation(x, signs, block, prologue)
    if not triton_can_run(x.device):
        return transform_activation_torch(x, signs, block, kind, out_dtype=out_dtype,
                                          prologue=prologue)
    m = x.shape[0]
    k = x.shape[1] // 2 if prologue.glu else x.shape[1]
    dtype = out_dtype or x.dtype
    act = _alloc(ActKind(kind), m, k, dtype, x.device)
    res = prologue.residual
    if res is not None:
        act.residual = torch.empty(m, k, dtype=res.dtype, device=x.device)
        if res.stride(1) != 1:
            res = res.contiguous()
    if prologue.return_input:
        act.linear_input = torch.empty(m, k, dtype=x.dtype, device=x.device)
    if m == 0:
        return act
    if x.stride(1) != 1:
        x = x.contiguous()
    seg = _segment(k, b, prologue.rms_group)
    log_b = b.bit_length() - 1
    dummy = act.data
    gsum = act.group_sum if act.group_sum is not None else dummy
    gscale = act.group_scale if act.group_scale is not None else dummy
    rmsw, gate, xout = prologue.rms_weight, prologue.gate, act.linear_input
    rms_block = min(1024, triton.next_power_of_2(k))
    pdl = use_pdl(x.device)
    _act_kernel[(m, k // seg)](
        x, res if res is not None else x, act.residual if res is not None else x,
        signs if signs is not None else x, rmsw if rmsw is not None else x,
        gate if gate is not None else x, xout if xout is not None else x, act.data, gscale,
        gsum, k, x.stride(0),
        res.stride(0) if res is not None else 0, gate.stride(0) if gate is not None else 0,
        act.data.numel() // m, k // GROUP, float(prologue.eps), float(prologue.rms_offset),
        SEG=seg, LOG_B=log_b, INV_SQRT_B=1.0 / math.sqrt(b),
        HAS_SIGNS=signs is not None, HAS_RMS=rmsw is not None,
        RMS_BLOCK=rms_block, HAS_XOUT=xout is not None,
        # the whole-row norm's chunks (a constexpr only there: other calls share one compile)
        RMS_STEPS=-(-k // rms_block) if rmsw is not None and not prologue.rms_group else 1,
        RMS_GROUP=prologue.rms_group,
        GLU=prologue.glu, HAS_RES=res is not None, HAS_GATE=gate is not None,
        GATE_SIGMOID=prologue.gate_sigmoid, MODE=int(kind), PDL=pdl,
        num_warps=4 if seg >= 512 else 2, **pdl_launch(pdl))
    return act


def hadamard_transform(x: torch.Tensor, signs: torch.Tensor, block: int,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Standalone signed block Hadamard ``Hblk(signs * x)`` of x [..., K] (Triton)."""
    lead = x.shape[:-1]
    act = transform_activation(x.reshape(-1, x.shape[-1]), signs, block, ActKind.FLOAT,
                               out_dtype=out_dtype)
    return act.data.reshape(*lead, x.shape[-1])


# ------------------------------------------------------------------------------- torch


def block_hadamard_torch(x: torch.Tensor, block: int) -> torch.Tensor:
    """Normalized Sylvester Walsh-Hadamard on each ``block``-chunk of x's last dimension, in
    x's dtype: the one torch implementation of the serving path (functional, so Dynamo
    traces it; the butterflies in the order of the Triton producer and of the format
    layer's reference, vllm_prism.gguf.hadamard)."""
    shape = x.shape
    y = x.reshape(-1, block)
    h = 1
    while h < block:
        v = y.reshape(-1, block // (2 * h), 2, h)
        a, b = v[:, :, 0, :], v[:, :, 1, :]
        y = torch.stack([a + b, a - b], dim=2).reshape(-1, block)
        h *= 2
    return (y * (1.0 / math.sqrt(block))).reshape(shape)


def signed_hadamard_torch(x: torch.Tensor, signs: torch.Tensor, block: int) -> torch.Tensor:
    """``Hblk(signs * x)`` in float32: the input transform of a folded linear layer."""
    return block_hadamard_torch(x.float() * signs.float(), block)


def inverse_signed_hadamard_torch(z: torch.Tensor, signs: torch.Tensor,
                                  block: int) -> torch.Tensor:
    """``signs * Hblk(z)`` in float32: the transform after an embedding lookup."""
    return block_hadamard_torch(z.float(), block) * signs.float()


def apply_prologue_torch(x: torch.Tensor, pro: Prologue
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The prologue in fp32 torch: (values [M, K], x + residual in the residual's dtype)."""
    xf = x.float()
    if pro.glu:
        k = x.shape[-1] // 2
        xf = torch.nn.functional.silu(xf[..., :k]) * xf[..., k:]
    res_out = None
    if pro.residual is not None:
        xf = xf + pro.residual.float()
        res_out = xf.to(pro.residual.dtype)
    if pro.rms_weight is not None:
        w = pro.rms_weight.float() + pro.rms_offset
        if pro.rms_group:
            xg = xf.reshape(*xf.shape[:-1], -1, pro.rms_group)
            xg = xg * torch.rsqrt(xg.pow(2).mean(dim=-1, keepdim=True) + pro.eps)
            xf = (xg * w).reshape(xf.shape)
        else:
            xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + pro.eps) * w
    if pro.gate is not None:
        z = pro.gate.float()
        xf = xf * (torch.sigmoid(z) if pro.gate_sigmoid else torch.nn.functional.silu(z))
    return xf, res_out


def transform_activation_torch(x: torch.Tensor, signs: torch.Tensor | None, block: int | None,
                               kind: ActKind = ActKind.FLOAT, *,
                               out_dtype: torch.dtype | None = None,
                               prologue: Prologue = NO_PROLOGUE) -> PQ2Activation:
    """Same result and layouts as :func:`transform_activation`, in plain torch."""
    b = check_activation(x, signs, block, prologue)
    xf, res_out = apply_prologue_torch(x, prologue)
    linear_input = xf.to(x.dtype) if prologue.return_input else None
    m, k = xf.shape
    g = k // GROUP
    dtype = out_dtype or x.dtype
    if signs is not None:
        xf = xf * signs.to(xf.device, torch.float32)
    if b > 1:
        xf = block_hadamard_torch(xf, b)
    kind = ActKind(kind)
    if kind == ActKind.FLOAT:
        act = PQ2Activation(kind, xf.to(dtype), m, k, dtype, residual=res_out)
    elif kind == ActKind.F32_PERM:  # [M, w, q, b] -> [M, b, q, w], scaled by 4**-(4(b%2)+q)
        xw = xf.reshape(m, k // 16, 4, 4).permute(0, 3, 2, 1)
        q = torch.arange(4, device=x.device).view(1, 4, 1)
        b = torch.arange(4, device=x.device).view(4, 1, 1)
        perm = (xw * torch.exp2(-2.0 * (4 * (b % 2) + q))).reshape(m, 16, k // 16)
        gsum = xf.reshape(m, g, GROUP).sum(dim=2)
        act = PQ2Activation(kind, perm.contiguous(), m, k, dtype, None, gsum, res_out)
    else:
        q, amax = quantize_int8_groups(xf)
        qsum = q.sum(dim=2, dtype=torch.int32)
        act = PQ2Activation(kind, q.reshape(m, k).to(torch.int8), m, k, dtype, amax / 127.0,
                            qsum, res_out)
    act.linear_input = linear_input
    return act


def quantize_int8_groups(x: torch.Tensor, width: int = GROUP
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of ``width``) as int8 per row and ``width`` values, the
    producers' rule (scale max|x| / 127, round half away from zero), in x's float dtype:
    (q int32 [M, K / width, width], max|x| [M, K / width])."""
    m, k = x.shape
    xg = x.reshape(m, k // width, width)
    amax = xg.abs().amax(dim=2)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    v = xg * inv.unsqueeze(-1)
    q = (torch.floor(v.abs() + 0.5).clamp(max=127) * torch.sign(v)).to(torch.int32)
    return q, amax
