"""Kernel choice for the PQ2 linear op, and the op itself.

``pq2_linear(x, w, bias)`` computes ``y = W_st @ Hblk(s * x)`` (or ``W_st @ x`` for a weight
without signs) for x ``[..., K]``. Each kernel is a class with ``is_supported(capability)``
and ``can_implement(config) -> (ok, reason)``; the first class in :data:`KERNELS` that
accepts the call runs it, and every kernel passed over is logged once with its reason.
``VLLM_PRISM_PQ2_KERNEL=<name>[,<name>...]`` (see :mod:`vllm_prism.envs`) puts kernels first,
in that order; where none of them can run a call it falls back to the automatic order, with a
warning.

Every kernel gets its activation from the Triton producer in :mod:`.hadamard`, which applies
the signs and the block Hadamard in the same pass that writes the layout the kernel reads, so
the rotation adds no pass of its own. :func:`pq2_linear_fused` also runs a :class:`Prologue`
there: the SiLU-and-multiply, residual add and RMSNorm that feed the linear in the model.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from vllm_prism import envs
from vllm_prism.kernels.common import (HAS_TRITON, device_capability, interpreting, sm_count,
                                       use_pdl)
from vllm_prism.kernels.pq2.hadamard import (NO_PROLOGUE, ActKind, PQ2Activation, Prologue,
                                             check_activation, transform_activation,
                                             transform_activation_torch)
from vllm_prism.kernels.pq2.layout import PQ2Weight, PTQ1Weight

logger = logging.getLogger(__name__)

__all__ = ["PQ2LinearConfig", "PQ2LinearKernel", "KERNELS", "select_kernel", "pq2_linear",
           "pq2_linear_fused", "pq2_linear_from_activation"]

Weight = PQ2Weight | PTQ1Weight
_FLOAT_ACT = (torch.bfloat16, torch.float16)
MMA_MAX_M = 64
# The smallest M gemm_dq takes: below it the dequantization outweighs the GEMM it enables.
GEMM_DQ_MIN_M = 128
# The smallest M the automatic choice gives gemm_dq: the prefill size it was timed at on the
# H200, 1.6-1.9x mma_cuda on every model shape (GemmDqKernel).
GEMM_DQ_AUTO_MIN_M = 512
# The largest 16-bit temporary the automatic choice lets gemm_dq make: the largest Bonsai 2
# projection is 340 MiB (34816x5120); the LM head (2.4 GiB at 248320x5120), which runs at
# M >= 512 for 512 concurrent requests or prompt log-probabilities, keeps the int8 kernels
# (a 2.4 GiB temporary in vLLM's memory profiling would come out of the KV cache).
GEMM_DQ_AUTO_MAX_BYTES = 512 << 20
# The largest e4m3 copy of a matrix gemm_fp8 makes (1 byte a weight): every Bonsai 2 projection
# (178 MiB at most), not the LM head (1.2 GiB at 248320x5120, which vLLM's memory profiling
# would not see: it runs at M >= 128 only for prompt log-probabilities or large batches).
GEMM_FP8_MAX_BYTES = 512 << 20
# The largest M the automatic choice gives the CUDA C++ tensor-core kernel (mma_cuda): up to
# where gemm_dq takes over (MmaCudaA8Kernel).
MMA_CUDA_AUTO_MAX_M = GEMM_DQ_AUTO_MIN_M - 1
# The automatic range of the small-batch CUDA C++ kernel (mma_small_cuda); from K = 6144 its
# streaming variant comes first in the order (MmaStreamCudaA8Kernel).
MMA_SMALL_AUTO_M = (3, 8)
# The automatic range of the streaming small-batch kernel (mma_stream_cuda), the smallest K it
# takes there (K slices of 8 or more warps a 16-row tile), and the K from which it also takes
# M = 2 from the GEMV (MmaStreamCudaA8Kernel).
MMA_STREAM_AUTO_M = (2, 8)
MMA_STREAM_AUTO_MIN_K = 6144
MMA_STREAM_AUTO_M2_MIN_K = 8193
# The automatic range of the short-pass small-batch kernel (mma_lean_cuda), first in the
# order for M = 2..8 where K % 512 == 0 (MmaLeanCudaA8Kernel).
MMA_LEAN_AUTO_M = (2, 8)
# The rows the CUDA C++ GEMV (gemv_cuda) takes, and its automatic range (GemvCudaA8Kernel).
GEMV_CUDA_MAX_M = 4
GEMV_CUDA_AUTO_M = (1, 2)
# The most int8 activation bytes (M x K) the GEMV stages in shared memory: with their sums and
# scales about 78 KiB, under the 99 KiB a block may take on sm_86 / sm_89 (kPq2GemvMaxMK of
# csrc/pq2/gemv_int8.cuh, which its op checks too).
GEMV_CUDA_MAX_MK = 73728
# The widest K the GEMV with the producer in its launch takes (kPq2GemvFusedMaxK of
# csrc/pq2/gemv_int8.cuh: 32 values a thread of a 1024-thread CTA), and its smallest
# per-group norm (rms_group: 32 values, one lane).
GEMV_FUSED_MAX_K = 32768
GEMV_FUSED_MIN_RMS_GROUP = 32
# wgmma_fold's scale levels: |q| <= 63 keeps code 3's weight 2q an int8; 127 for codes with no 3.
FOLD_LEVELS = 63
FOLD_LEVELS_TERNARY = 127


@dataclass(frozen=True)
class PrologueFeatures:
    """What of a call's :class:`Prologue` a kernel whose own launch runs it must support:
    ``mixed_dtype`` names the first residual / gate tensor whose dtype is not x's ("" when
    none), ``rms_group`` the per-group RMSNorm width (0: the whole row or no norm),
    ``return_input`` whether the prologue's result is returned too."""

    mixed_dtype: str = ""
    rms_group: int = 0
    return_input: bool = False

    @classmethod
    def of(cls, prologue: Prologue, dtype: torch.dtype) -> PrologueFeatures:
        mixed = ""
        for name in ("residual", "gate"):
            t = getattr(prologue, name)
            if t is not None and t.dtype != dtype and not mixed:
                mixed = f"{name} is {t.dtype}, x is {dtype}"
        return cls(mixed_dtype=mixed, rms_group=prologue.rms_group,
                   return_input=prologue.return_input)


NO_PROLOGUE_FEATURES = PrologueFeatures()


@dataclass(frozen=True)
class PQ2LinearConfig:
    """What a kernel needs to know to accept a call (the prologue's features included, so
    that one selection decides)."""

    m: int
    n: int
    k: int
    dtype: torch.dtype
    fmt: str
    device_type: str
    capability: tuple[int, int] | None
    hadamard_block: int | None = None
    prologue: PrologueFeatures = NO_PROLOGUE_FEATURES
    # the scale plane takes loads of four fp16 scales (8-byte aligned, row stride % 4 == 0):
    # the loader's planes always do, a view into foreign storage might not
    scales_by_four: bool = True
    # the codes are known to hold no 3 (PQ2Weight.is_ternary): wgmma_fold's 127 levels
    ternary: bool = False
    # VLLM_PRISM_PQ2_FOLD_PREFILL: the automatic choice may give wgmma_fold gemm_dq's calls
    fold_prefill: bool = False

    @classmethod
    def of(cls, m: int, w: Weight, dtype: torch.dtype,
           prologue: Prologue = NO_PROLOGUE) -> PQ2LinearConfig:
        # the switch is read only where it can change the choice (a decode call skips it)
        fold = m >= GEMM_DQ_AUTO_MIN_M and envs.VLLM_PRISM_PQ2_FOLD_PREFILL
        return cls(m=m, n=w.n, k=w.k, dtype=dtype, fmt=w.fmt, device_type=w.device.type,
                   capability=device_capability(w.device),
                   hadamard_block=w.hadamard_block,
                   prologue=PrologueFeatures.of(prologue, dtype),
                   scales_by_four=_scales_by_four(w), ternary=fold and _known_ternary(w),
                   fold_prefill=fold)


def _known_ternary(w: Weight) -> bool:
    """Whether ``w``'s codes are known to hold no 3 (False where unknown: a fake tensor's
    plane while tracing, or another format). PQ2LinearConfig.of looks it up only where it can
    change the choice (VLLM_PRISM_PQ2_FOLD_PREFILL on, from M = GEMM_DQ_AUTO_MIN_M:
    wgmma_fold's automatic range): the decode path's calls make their weight views anew each
    time and skip it."""
    if not isinstance(w, PQ2Weight):
        return False
    try:
        return w.is_ternary()
    except RuntimeError:  # a fake tensor (tracing) has no address to look up
        return False


def _scales_by_four(w: Weight) -> bool:
    """Whether ``w``'s scale plane can be read four fp16 scales (8 bytes) a load."""
    scales = getattr(w, "scales", None)
    if scales is None or scales.dim() != 2 or scales.element_size() != 2:
        return False
    try:
        ptr = scales.data_ptr()
    except RuntimeError:  # a fake tensor (tracing): the op checks again when it runs
        return True
    return ptr % 8 == 0 and scales.stride(0) % 4 == 0 and scales.stride(1) == 1


def _triton_supported(capability: tuple[int, int] | None) -> tuple[bool, str]:
    if not HAS_TRITON:
        return False, "Triton is not installed"
    if capability is None:
        if interpreting():
            return True, ""
        return False, "not a CUDA device (set TRITON_INTERPRET=1 to run Triton on CPU)"
    if interpreting():
        return False, "TRITON_INTERPRET=1 runs Triton on CPU tensors only"
    if capability < (8, 0):
        major, minor = capability
        return False, f"needs compute capability >= 8.0, this GPU is {major}.{minor}"
    return True, ""


class PQ2LinearKernel:
    """One way to run the linear op. Subclasses set ``name`` and ``act_kind``."""

    name: ClassVar[str] = ""
    act_kind: ClassVar[ActKind] = ActKind.FLOAT
    act_fp32: ClassVar[bool] = False  # FLOAT activation in fp32 instead of x's dtype
    # The automatic choice: whether it considers this kernel, and from / up to which M (None:
    # any M can_implement takes). VLLM_PRISM_PQ2_KERNEL can still name it for any M.
    in_auto: ClassVar[bool] = True
    auto_min_m: ClassVar[int] = 1
    auto_max_m: ClassVar[int | None] = None

    @classmethod
    def is_supported(cls, capability: tuple[int, int] | None) -> tuple[bool, str]:
        return _triton_supported(capability)

    @classmethod
    def can_implement(cls, c: PQ2LinearConfig) -> tuple[bool, str]:
        raise NotImplementedError

    @classmethod
    def auto_accepts(cls, c: PQ2LinearConfig) -> tuple[bool, str]:
        """Whether the automatic choice considers this kernel for ``c`` (before
        ``can_implement``): where it was measured to be the fastest that can run."""
        if not cls.in_auto:
            return False, "runs only where VLLM_PRISM_PQ2_KERNEL names it"
        if c.m < cls.auto_min_m or (cls.auto_max_m is not None and c.m > cls.auto_max_m):
            return False, (f"M = {c.m} outside its automatic range {cls.auto_min_m}.."
                           f"{cls.auto_max_m if cls.auto_max_m is not None else 'inf'}")
        return True, ""

    @classmethod
    def run(cls, act: PQ2Activation, w: Weight, bias: torch.Tensor | None,
            out_dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def make_activation(cls, x: torch.Tensor, w: Weight,
                        prologue: Prologue = NO_PROLOGUE) -> PQ2Activation:
        """The activation this kernel reads: one producer launch (prologue, signs, Hadamard,
        layout)."""
        return transform_activation(x, w.signs, w.hadamard_block, cls.act_kind,
                                    out_dtype=torch.float32 if cls.act_fp32 else None,
                                    prologue=prologue)


def _pq2_only(c: PQ2LinearConfig) -> tuple[bool, str]:
    if c.fmt != "PQ2_0":
        return False, f"reads PQ2_0 planes, weight is {c.fmt}"
    return True, ""


class GemvA8Kernel(PQ2LinearKernel):
    """M = 1..gemv_max_m(N) (2 or 4): int8-activation dp4a GEMV, weights read once per
    program's rows (triton_gemv.gemv_a8)."""

    name = "gemv_a8"
    act_kind = ActKind.Q8

    @classmethod
    def can_implement(cls, c: PQ2LinearConfig) -> tuple[bool, str]:
        from vllm_prism.kernels.pq2.triton_gemv import gemv_max_m
        if c.m > gemv_max_m(c.n):
            return False, f"M = {c.m} > {gemv_max_m(c.n)} for N = {c.n}"
        return _pq2_only(c)

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        from vllm_prism.kernels.pq2.triton_gemv import gemv_a8
        return gemv_a8(act, w, bias, out_dtype)


class GemvA16Kernel(PQ2LinearKernel):
    """M = 1: fp32-activation GEMV (triton_gemv.gemv_a16), the reference's precision."""

    name = "gemv_a16"
    act_kind = ActKind.F32_PERM

    @classmethod
    def can_implement(cls, c: PQ2LinearConfig) -> tuple[bool, str]:
        if c.m != 1:
            return False, f"M = {c.m} (GEMV takes M = 1)"
        return _pq2_only(c)

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        from vllm_prism.kernels.pq2.triton_gemv import gemv_a16
        return gemv_a16(act, w, bias, out_dtype)


class PTQ1GemvKernel(PQ2LinearKernel):
    """M = 1 on PTQ1_0 weights, reading the packed trits (ptq1.ptq1_gemv)."""

    name = "ptq1_gemv"
    act_kind = ActKind.FLOAT
    act_fp32 = True

    @classmethod
    def can_implement(cls, c: PQ2LinearConfig) -> tuple[bool, str]:
        if c.fmt != "PTQ1_0":
            return False, f"reads PTQ1_0 weights, weight is {c.fmt}"
        if c.m != 1:
            return False, f"M = {c.m} (GEMV takes M = 1)"
        return True, ""

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        from vllm_prism.kernels.pq2.ptq1 import ptq1_gemv
        return ptq1_gemv(act, w, bias, out_dtype)


def _tc_run(act: PQ2Activation, w: Weight, bias: torch.Tensor | None, out_dtype: torch.dtype,
            prefill: bool) -> torch.Tensor:
    from vllm_prism.kernels.pq2.triton_mma import (default_gemm_config, default_mma_config,
                                                   pq2_tc_linear)
    if isinstance(w, PTQ1Weight):
        _log_once(logging.INFO, ("ptq1-copy",), "PQ2 linear: PTQ1_0 weights with M > 1 run "
                  "through a lossless PQ2_0 copy made once per weight (34/28 of its bytes)")
        pw = w.as_pq2()
    else:
        pw = w
    cfg_fn = default_gemm_config if prefill else default_mma_config
    cfg = cfg_fn(act.m, pw.n, pw.k, _num_sms(pw.device), a8=act.kind == ActKind.Q8,
                 dtype=act.dtype)
    return pq2_tc_linear(act, pw, bias, out_dtype, cfg)


def _tc_can_implement(c: PQ2LinearConfig, lo: int, hi: int | None,
                      a8: bool) -> tuple[bool, str]:
    if c.m < lo or (hi is not None and c.m > hi):
        return False, f"M = {c.m} outside {lo}..{hi if hi is not None else 'inf'}"
    if not a8 and c.dtype not in _FLOAT_ACT:
        return False, f"activation dtype {c.dtype} (needs bf16 or fp16)"
    return True, ""


class MmaA16Kernel(PQ2LinearKernel):
    """M = 2..64: bf16/fp16 tensor-core kernel with decoded tiles (triton_mma). Its
    subclasses differ only in the M range they take and the activation they read."""

    name = "mma_a16"
    act_kind = ActKind.FLOAT
    max_m: ClassVar[int | None] = MMA_MAX_M  # None: any M >= 2 (prefill tiles above 64)

    @classmethod
    def can_implement(cls, c):
        return _tc_can_implement(c, 2, cls.max_m, a8=cls.act_kind == ActKind.Q8)

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        prefill = cls.max_m is None and act.m > MMA_MAX_M
        return _tc_run(act, w, bias, out_dtype, prefill=prefill)


class MmaA8Kernel(MmaA16Kernel):
    """M = 2..64: int8 tensor-core kernel (int8 activations per 128-group)."""

    name = "mma_a8"
    act_kind = ActKind.Q8


class GemmA16Kernel(MmaA16Kernel):
    """Prefill (M > 64): bf16/fp16 tensor-core GEMM, weights decoded in registers."""

    name = "gemm_a16"
    max_m = None


class GemmA8Kernel(GemmA16Kernel):
    """Prefill (M > 64): int8 tensor-core GEMM."""

    name = "gemm_a8"
    act_kind = ActKind.Q8


def _gemm_dq_matrix(c: PQ2LinearConfig) -> tuple[bool, str]:
    """Whether the automatic choice gives the matrix to gemm_dq (and so to the prefill kernel
    that takes its place, wgmma_fold): its 16-bit copy within ``GEMM_DQ_AUTO_MAX_BYTES``."""
    if c.n * c.k * 2 > GEMM_DQ_AUTO_MAX_BYTES:
        return False, (f"N x K = {c.n} x {c.k}: a {c.n * c.k * 2 >> 20} MiB temporary, over "
                       f"{GEMM_DQ_AUTO_MAX_BYTES >> 20} MiB")
    return True, ""


class GemmDqKernel(PQ2LinearKernel):
    """Prefill (M >= ``GEMM_DQ_MIN_M``): the weight dequantized to the activation's dtype in one
    pass (triton_dequant), then ``F.linear`` (cuBLAS) on the rotated bf16/fp16 activation; a
    temporary of the whole matrix in 16 bits lives for the call (340 MiB for the largest 27B
    projection). The automatic choice from M = ``GEMM_DQ_AUTO_MIN_M`` for matrices of up to
    ``GEMM_DQ_AUTO_MAX_BYTES`` in 16 bits (not the LM head): on the H200 at M = 512 it
    took 70-360 us against mma_cuda's 142-612 us on the four 27B shapes, and through vLLM a
    4K-token prefill ran at 9,944-10,607 tok/s against 6,372-6,426 with mma_cuda / the
    Triton GEMM (benchmarks/results/pq2_linear_h200.md, e2e_h200.md)."""

    name = "gemm_dq"
    auto_min_m = GEMM_DQ_AUTO_MIN_M

    @classmethod
    def auto_accepts(cls, c):
        ok, why = super().auto_accepts(c)
        return _gemm_dq_matrix(c) if ok else (ok, why)

    @classmethod
    def can_implement(cls, c):
        if c.m < GEMM_DQ_MIN_M:
            return False, f"M = {c.m} < {GEMM_DQ_MIN_M} (a prefill path)"
        if c.dtype not in _FLOAT_ACT:
            return False, f"activation dtype {c.dtype} (needs bf16 or fp16)"
        return _pq2_only(c)

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        from vllm_prism.kernels.pq2.triton_dequant import dequantize_pq2
        dense = dequantize_pq2(w, act.data.dtype)
        bias = None if bias is None else bias.to(act.data.dtype)
        return F.linear(act.data, dense, bias).to(out_dtype)


class GemmFp8Kernel(PQ2LinearKernel):
    """Prefill (M >= ``GEMM_DQ_MIN_M``) on the FP8 tensor cores (triton_fp8): the codes
    written as e4m3 (-1 / 0 / +1, exact; 1 byte a weight, half of gemm_dq's temporary), the
    rotated activation quantized to e4m3 per token and 128-group, and cuBLAS's FP8 GEMM with
    1x128 block scales on both operands (``torch._scaled_mm``, sm_90). On the H200 it ran at
    0.95-1.22x the speed of bf16 ``F.linear`` at M = 2048-4096 (1.05-1.35x gemm_dq) but
    0.54-0.90x at M = 512, with a relative error of 2.6 % against 0.17 % for bf16
    (benchmarks/results/pq2_fp8_gemm_h200.md): only where VLLM_PRISM_PQ2_KERNEL names it."""

    name = "gemm_fp8"
    in_auto = False

    @classmethod
    def is_supported(cls, capability):
        ok, why = _triton_supported(capability)
        if ok and (capability is None or capability[0] != 9):
            return False, "cuBLAS's FP8 1x128 block scaling runs on sm_90 (Hopper) only"
        if ok and not hasattr(torch, "float8_e4m3fn"):
            return False, "this torch has no float8_e4m3fn"
        return ok, why

    @classmethod
    def can_implement(cls, c):
        ok, why = GemmDqKernel.can_implement(c)  # the same prefill range and activations
        if not ok:
            return ok, why
        if c.n % 16:
            return False, f"N = {c.n} is not a multiple of 16 (cuBLAS FP8)"
        if c.n * c.k > GEMM_FP8_MAX_BYTES:
            return False, (f"N x K = {c.n} x {c.k}: a {c.n * c.k >> 20} MiB e4m3 temporary, "
                           f"over {GEMM_FP8_MAX_BYTES >> 20} MiB (the LM head)")
        return True, ""

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        from vllm_prism.kernels.pq2.triton_fp8 import gemm_fp8
        y = gemm_fp8(act.data, w, bias, out_dtype=torch.bfloat16
                     if out_dtype == torch.bfloat16 else torch.float32)
        return y.to(out_dtype)


class _CudaOpKernel(PQ2LinearKernel):
    """A kernel of vllm_prism._C (csrc/pq2) behind the op ``torch.ops._C_prism.<op>``, on
    int8 activations unless a subclass's ``act_kind`` says otherwise."""

    op: ClassVar[str] = ""
    act_kind = ActKind.Q8

    @classmethod
    def is_supported(cls, capability):
        from vllm_prism._custom_ops import has_compiled_op

        if capability is None:
            return False, "not a CUDA device"
        if capability < (8, 0):
            return False, f"needs compute capability >= 8.0, this GPU is {capability}"
        if not has_compiled_op(cls.op):
            return False, f"vllm_prism._C with {cls.op} is not built"
        return True, ""


class WgmmaCudaKernel(_CudaOpKernel):
    """Prefill (M >= ``GEMM_DQ_MIN_M``) on Hopper's integer warpgroup MMA, one CUDA C++ op
    (csrc/pq2/wgmma_prefill.cu, ``torch.ops._C_prism.pq2_wgmma_prefill``): the rotated
    activation quantized to int8 per token and 128-group into wgmma's tiled layout, then a
    warp-specialized GEMM (a producer warp's bulk copies, two consumer warpgroups) that decodes
    the codes straight into the MMA's registers: no dense temporary, int8 activation precision.
    On the H200 the GEMM with its quantization ran at 0.75-0.92x the speed of bf16
    ``F.linear`` at M = 2048-4096 and 0.51-0.79x at M = 512
    (benchmarks/results/pq2_wgmma_sweep_h200.md): only where VLLM_PRISM_PQ2_KERNEL names it.
    Needs vllm_prism._C built with sm_90 among its architectures, on compute capability 9.0."""

    name = "wgmma_cuda"
    in_auto = False
    op = "pq2_wgmma_prefill"
    act_kind = ActKind.FLOAT  # the op quantizes the rotated 16-bit activation itself

    @classmethod
    def is_supported(cls, capability):
        if capability is not None and capability != (9, 0):
            return False, (f"the sm_90a warpgroup MMA runs on compute capability 9.0 only, "
                           f"this GPU is {capability[0]}.{capability[1]}")
        return super().is_supported(capability)

    @classmethod
    def can_implement(cls, c):
        ok, why = GemmDqKernel.can_implement(c)  # the same prefill range and activations
        if ok and c.k % 128:
            return False, f"K = {c.k} is not a multiple of 128"
        return ok, why

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        x = act.data
        if x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
            x = x.contiguous()
        dtype16 = out_dtype if out_dtype in (torch.bfloat16, torch.float16) else x.dtype
        y = cls.gemm(w, x, dtype16)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.to(out_dtype)

    @classmethod
    def gemm(cls, w, x: torch.Tensor, dtype16: torch.dtype) -> torch.Tensor:
        """The op on a 16-bit activation with 16-byte aligned rows."""
        return getattr(torch.ops._C_prism, cls.op)(w.codes, w.scales, x, dtype16)


class WgmmaFoldKernel(WgmmaCudaKernel):
    """``wgmma_cuda`` with the weight scales folded into the int8 weights (op
    ``torch.ops._C_prism.pq2_wgmma_fold_prefill``, csrc/pq2/wgmma_fold.cuh): in each 1024-wide
    block of K (the Hadamard rotation's block) a row's group scale d becomes D * q with
    D = max |d| / L and q an integer of -L..L, the weight (c - 1) * q an int8, and the
    activation is quantized per token and 1024-block, so the int32 sums are promoted once a
    block instead of once a 128-group and the MMAs run back to back. L is 127 where the codes
    hold no 3 (every ternary checkpoint: checked when the planes are prepared,
    ``PQ2Weight.is_ternary``), else 63 (so that the weight of code 3, 2q, stays an int8). An
    approximation of the weights: a group scale moves by up to 0.5 / |q| of itself (0.4 % /
    0.8 % for the block's largest at L = 127 / 63; emulated on the CPU the kernel's error is
    0.76-0.89 % / 0.88-1.07 %, the M = 1 GEMV's int8 activation alone 0.60-0.66 %,
    benchmarks/results/fold_numerics_cpu.md). On the H200 (at L = 63) it ran 1.29-1.42x
    faster than wgmma_cuda; with its quantization 1.09-1.30x bf16 ``F.linear`` at M =
    2048-4096, 1.04-1.17x on the two wide projections at M = 512 and
    0.75-0.78x on the 5120-row ones there, with a relative error of 0.66-0.70 % where a
    block's scales lie within +-12.5 % (benchmarks/results/pq2_wgmma_sweep_h200.md); through
    vLLM a 4K prefill 1.19-1.21x gemm_dq. It moves the output 1.2-1.35x as far as the int8
    activation of the decode kernels (which the automatic choice gives prefill chunks of
    M < 512): through vLLM on the H200 a prompt's log-probs 1.036 against 0.867 nats from
    gemm_dq's on the 27B-shaped file (benchmarks/results/pq2_prefill_quality_h200.md), and
    the tiny model's 640-token prompt 0.35-0.40 nats from transformers' at most against
    gemm_dq's 0.17-0.19, over the e2e tests' 0.35 (tests/e2e/test_gpu_llm.py, 2026-12-05).
    So it takes gemm_dq's calls (from M = ``GEMM_DQ_AUTO_MIN_M`` on compute capability 9.0
    where the codes are ternary, 127 levels, and the matrix is one gemm_dq would take: not
    the LM head) only with ``VLLM_PRISM_PQ2_FOLD_PREFILL=1``; the exact gemm_dq otherwise."""

    name = "wgmma_fold"
    op = "pq2_wgmma_fold_prefill"
    in_auto = True
    auto_min_m = GEMM_DQ_AUTO_MIN_M

    @classmethod
    def auto_accepts(cls, c):
        if not c.fold_prefill:
            return False, ("VLLM_PRISM_PQ2_FOLD_PREFILL is off: gemm_dq keeps the exact "
                           "prefill")
        ok, why = super().auto_accepts(c)
        if ok:
            ok, why = _gemm_dq_matrix(c)  # the matrices gemm_dq would take
        if ok and not c.ternary:
            return False, ("the codes may hold a 3 (63 scale levels, twice the rounding): "
                           "gemm_dq is exact there")
        return ok, why

    @classmethod
    def gemm(cls, w, x, dtype16):
        levels = FOLD_LEVELS_TERNARY if w.is_ternary() else FOLD_LEVELS
        return torch.ops._C_prism.pq2_wgmma_fold_prefill(w.codes, w.scales, x, dtype16, levels)


class GemvCudaA8Kernel(_CudaOpKernel):
    """M = 1..4: int8 dp4a GEMV in CUDA C++ (csrc/pq2/gemv_int8.cu, op
    ``torch.ops._C_prism.pq2_gemv_int8``): the codes stream global -> registers, 16 bytes a
    load and every load of a row pass issued at once, a few lanes per row, warps grid-stride;
    each chunk of codes serves every activation row. Needs vllm_prism._C. The automatic
    choice for M in ``GEMV_CUDA_AUTO_M`` (1..2). On the H200 (2026-12-01,
    benchmarks/results/pq2_linear_h200.md, producer included) it took 10.3 / 17.9 / 7.9 /
    13.9 us at M = 1 on 12288x5120 / 34816x5120 / 5120x6144 / 5120x17408 against the Triton
    GEMV's 11.4 / 23.8 / 9.6 / 15.9, and 12.9 / 26.4 / 9.6 / 18.5 at M = 2 against
    mma_small_cuda's 15.8 / 32.4 / 11.7 / 22.5; at M = 3 they are even (15.0 / 33.8 / 11.8 /
    23.4 against 15.9 / 32.9 / 11.8 / 22.7: its dp4a count grows with M) and at M = 4
    mma_small_cuda wins. Kernel alone it reads at 0.70-0.84 of the speed of a streaming read
    of the same bytes (pq2_gemv_sweep_h200.md). Through vLLM batch-1 decode went from 185.8
    to 208.5 tok/s (e2e_h200.md)."""

    name = "gemv_cuda"
    op = "pq2_gemv_int8"
    auto_min_m, auto_max_m = GEMV_CUDA_AUTO_M

    @classmethod
    def can_implement(cls, c):
        if not 1 <= c.m <= GEMV_CUDA_MAX_M:
            return False, f"M = {c.m} outside 1..{GEMV_CUDA_MAX_M}"
        if c.k % 64 or c.k > 49152:
            return False, f"K = {c.k}: needs a multiple of 64, at most 49152"
        if c.m * c.k > GEMV_CUDA_MAX_MK:
            return False, (f"M x K = {c.m * c.k} activation bytes exceed the {GEMV_CUDA_MAX_MK} "
                           "its shared memory holds on every sm_80+ GPU")
        return _pq2_only(c)

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        return torch.ops._C_prism.pq2_gemv_int8(w.codes, w.scales, act.data, act.group_scale,
                                                bias, out_dtype, use_pdl(w.device))


class GemvFusedCudaKernel(_CudaOpKernel):
    """M = 1: the CUDA C++ GEMV with the activation producer in its own launch
    (csrc/pq2/gemv_int8.cu, op ``torch.ops._C_prism.pq2_gemv_fused``): a linear is one launch
    instead of two. Each warp asks L2 for its first row group's codes before the
    grid-dependency wait, then every CTA (one a multiprocessor) builds the int8 activation from
    x in shared memory: the prologue (SiLU-and-multiply, residual add written back, RMSNorm over
    the row or per group of >= 32 values, gate), the signs, the block Hadamard in registers and
    lane shuffles, the per-128-group quantization, in the Triton producer's order; then the
    streaming GEMV of ``gemv_cuda``. Needs vllm_prism._C; 16-bit x (and residual / gate of
    x's dtype). Correct on the H200 (tests/kernels/test_pq2_gemv_fused.py) but slower than the
    producer launch + ``gemv_cuda`` it replaces: kernel by kernel (plain prologue, PDL on)
    11.7 / 30.3 / 8.5 / 19.0 us against 8.5 / 18.7 / 7.1 / 15.1 on 12288x5120 / 34816x5120 /
    5120x6144 / 5120x17408, through vLLM batch 1 at 143.6 against 202.6 tok/s
    (benchmarks/results/pq2_linear_h200_notes.md): one 1024-thread CTA a multiprocessor
    runs the producer's latency chain before its first weight load while the two-launch path
    overlaps it (PDL), so it runs only where ``VLLM_PRISM_PQ2_KERNEL`` names it."""

    name = "gemv_fused_cuda"
    op = "pq2_gemv_fused"
    act_kind = ActKind.RAW
    in_auto = False

    @classmethod
    def can_implement(cls, c):
        if c.m != 1:
            return False, f"M = {c.m} (it takes M = 1)"
        if c.k % 128 or c.k > GEMV_FUSED_MAX_K:
            return False, f"K = {c.k}: needs a multiple of 128, at most {GEMV_FUSED_MAX_K}"
        if c.dtype not in _FLOAT_ACT:
            return False, f"activation dtype {c.dtype} (needs bf16 or fp16)"
        # the producer runs in this kernel's launch: the prologue's features are its own
        if c.prologue.mixed_dtype:
            return False, c.prologue.mixed_dtype
        if c.prologue.return_input:
            return False, "the prologue's result is returned (return_input)"
        if 0 < c.prologue.rms_group < GEMV_FUSED_MIN_RMS_GROUP:
            return False, (f"rms_group {c.prologue.rms_group} < {GEMV_FUSED_MIN_RMS_GROUP} "
                           "values")
        if c.hadamard_block is not None and c.hadamard_block > 1024:
            return False, f"Hadamard block {c.hadamard_block} > 1024"
        return _pq2_only(c)

    @classmethod
    def make_activation(cls, x, w, prologue=NO_PROLOGUE):
        check_activation(x, w.signs, w.hadamard_block, prologue)
        if x.stride(-1) != 1:
            x = x.contiguous()
        if prologue.residual is not None and prologue.residual.stride(-1) != 1:
            prologue = dataclasses.replace(prologue, residual=prologue.residual.contiguous())
        act = PQ2Activation(ActKind.RAW, x, x.shape[0], w.k, x.dtype, prologue=prologue)
        if prologue.residual is not None:
            act.residual = torch.empty(prologue.residual.shape, dtype=x.dtype, device=x.device)
        return act

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        pro = act.prologue or NO_PROLOGUE
        return torch.ops._C_prism.pq2_gemv_fused(
            w.codes, w.scales, act.data, pro.residual, act.residual, pro.rms_weight, pro.gate,
            w.signs, bias, w.hadamard_block or 0, pro.glu, float(pro.rms_offset),
            float(pro.eps), pro.rms_group, pro.gate_sigmoid, out_dtype, use_pdl(w.device))


class MmaCudaA8Kernel(_CudaOpKernel):
    """Any M: int8 tensor-core kernel in CUDA C++ (csrc/pq2/mma_int8.cu, op
    ``torch.ops._C_prism.pq2_mma_int8``): the ternary codes decode straight into mma.sync
    fragments, once per weight for up to 64 activation rows (a CTA per 64-row tile above).
    Needs vllm_prism._C. The automatic choice for M past mma_small_cuda's range (or the
    GEMV's rows without it) up to ``MMA_CUDA_AUTO_MAX_M``: through vLLM on the H200
    (benchmarks/results/e2e_h200.md), 8 streams ran at 865.7 tok/s against 551.4 with the
    Triton kernel; from M = 512 gemm_dq is faster. ``VLLM_PRISM_PQ2_KERNEL=mma_cuda`` runs it
    at any M."""

    name = "mma_cuda"
    op = "pq2_mma_int8"
    auto_max_m = MMA_CUDA_AUTO_MAX_M

    @classmethod
    def can_implement(cls, c):
        if c.k % 256:
            return False, f"K = {c.k} is not a multiple of 256"
        return _pq2_only(c)

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        return torch.ops._C_prism.pq2_mma_int8(w.codes, w.scales, act.data, act.group_scale,
                                               act.group_sum, bias, out_dtype, 0,
                                               use_pdl(w.device))


class MmaSmallCudaA8Kernel(_CudaOpKernel):
    """M = 1..16: int8 tensor-core kernel in CUDA C++ for small batches (csrc/pq2/mma_small.cu,
    op ``torch.ops._C_prism.pq2_mma_small_int8``): the weights are the MMA's A operand (16 rows
    a tile, decoded from the code words straight into the fragment) and the tokens its B
    operand (8 a tile), a CTA requests all of its rows' codes into shared memory before
    computing and its warps split K. Needs vllm_prism._C. The automatic choice for M in
    ``MMA_SMALL_AUTO_M`` (3..8; below it gemv_cuda) where K < 6144 (from there
    ``mma_stream_cuda``, ahead of it in the order): on the H200 at
    M = 4 it took 12-33 us against 18-54 us for the int8 GEMV and 17-58 us for mma_cuda, at
    M = 8 14-36 us against mma_cuda's 16-52 us, except K = 17408 (31.5 against 27.3 us); at
    M = 16 mma_cuda wins every shape. Through vLLM 8 streams ran at 965-968 tok/s against
    842-852 (benchmarks/results/pq2_linear_h200.md, e2e_h200.md)."""

    name = "mma_small_cuda"
    op = "pq2_mma_small_int8"
    auto_min_m, auto_max_m = MMA_SMALL_AUTO_M

    @classmethod
    def can_implement(cls, c):
        if not 1 <= c.m <= 16:
            return False, f"M = {c.m} outside 1..16"
        if c.k % 128:
            return False, f"K = {c.k} is not a multiple of 128"
        return _pq2_only(c)

    variant: ClassVar[int] = 0  # the op's kernel variant (mma_small.cuh)

    @classmethod
    def with_variant(cls, variant: int) -> type["MmaSmallCudaA8Kernel"]:
        """This kernel running op variant ``variant`` instead (for the benchmark and the tests
        of variants that have no kernel name, e.g. 3: mma_stream_cuda's shorter K slices)."""
        return type(f"{cls.name}:{variant}", (cls,), {"variant": variant})

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        return torch.ops._C_prism.pq2_mma_small_int8(w.codes, w.scales, act.data,
                                                     act.group_scale, act.group_sum, bias,
                                                     out_dtype, use_pdl(w.device), cls.variant)


class MmaSmallPipeCudaA8Kernel(MmaSmallCudaA8Kernel):
    """``mma_small_cuda`` with its loads laid out for overlap (op variant 1): each warp
    requests its K slice's codes one 128-group at a time and computes a group as soon as it
    has landed, and (M <= 8) requests the next piece's activation before the current piece's
    MMAs; the same arithmetic in the same order, so the same result bit for bit. Written after
    the H200 timing put ``mma_small_cuda`` at 16-34 % of the bandwidth at M = 1..8 (its CTAs
    wait for all their codes before computing); runs only where ``VLLM_PRISM_PQ2_KERNEL`` names
    it until a GPU run has timed it against ``mma_small_cuda``."""

    name = "mma_small_pipe_cuda"
    in_auto = False
    variant = 1


class MmaStreamCudaA8Kernel(MmaSmallCudaA8Kernel):
    """M = 1..16: the small-batch int8 tensor-core kernel without shared-memory staging (op
    variant 2, csrc/pq2/mma_small.cu STREAM): a warp owns 16 weight rows and a K slice, and
    streams its codes global -> registers as the GEMV does (8 bytes a lane per row and
    128-group, every load of up to 10 groups issued at once, the first before the
    grid-dependency wait); the MMA's k index is permuted within each group so that a lane's
    A fragments are its own 8 bytes of codes. The same exact int32 group sums as
    ``mma_small_cuda``, added in another order. The automatic choice for M in
    ``MMA_STREAM_AUTO_M`` (2..8) where K >= ``MMA_STREAM_AUTO_MIN_K`` (6144: a 16-row tile
    splits over 8 or more warps), at M = 2 only where K >= ``MMA_STREAM_AUTO_M2_MIN_K``.
    On the H200 (2026-12-01, benchmarks/results/pq2_linear_h200_notes.md, producer
    included, PDL on) it took 9.7 / 9.8 / 10.1 us at M = 2 / 4 / 8 on 5120x6144 against
    mma_small_cuda's 11.2 / 11.0 / 12.4 (gemv_cuda 8.1 at M = 2), and 18.3 / 19.1 / 20.8 us
    on 5120x17408 against 19.0 / 20.5 / 27.5 (mma_cuda 27.7 at M = 8, gemv_cuda 23.1 at
    M = 2); on the K = 5120 shapes (4 warps a tile) mma_small_cuda stays faster (12288x5120
    M = 8: 13.0 against 14.1 us)."""

    name = "mma_stream_cuda"
    variant = 2
    auto_min_m, auto_max_m = MMA_STREAM_AUTO_M

    @classmethod
    def auto_accepts(cls, c):
        ok, why = super().auto_accepts(c)
        if ok and c.k < MMA_STREAM_AUTO_MIN_K:
            return False, f"K = {c.k} < {MMA_STREAM_AUTO_MIN_K}: mma_small_cuda is faster there"
        if ok and c.m == 2 and c.k < MMA_STREAM_AUTO_M2_MIN_K:
            return False, f"M = 2 with K = {c.k}: gemv_cuda is faster there"
        return ok, why


class MmaBulkCudaA8Kernel(MmaSmallCudaA8Kernel):
    """M = 1..16: the small-batch int8 tensor-core kernel that gives every multiprocessor the
    same bytes (op variant 4, csrc/pq2/mma_bulk.cu): one CTA a multiprocessor, the matrix's
    (16-row tile, 128-group) units cut into equal contiguous ranges (a tile shared by CTAs
    meets in a workspace, added in CTA order), read through a ring of shared-memory stages
    whose first ones are requested before the grid-dependency wait. The same exact int32
    group sums as ``mma_small_cuda``, added in another order. Flat in M, but on the H200
    2-2.7x slower than the automatic choice (12288x5120: 22.7 / 23.5 us at M = 1 / 8 against
    gemv_cuda's 8.6 and mma_small_cuda's 13.1; Nsight Compute: issue-latency bound at 10 % of
    DRAM throughput, benchmarks/results/pq2_linear_h200_notes.md), so it runs only where
    ``VLLM_PRISM_PQ2_KERNEL`` names it."""

    name = "mma_bulk_cuda"
    in_auto = False
    variant = 4


class MmaPersistCudaA8Kernel(MmaSmallCudaA8Kernel):
    """M = 1..16: ``mma_stream_cuda``'s warps (16 rows and a K slice each, codes streamed into
    registers) in as many CTAs as stay resident, which walk the matrix (op variant 5,
    csrc/pq2/mma_small.cu PERSIST): each warp issues its next item's loads (up to 5 groups)
    before computing the current one, so loads stay in flight across its tiles as the GEMV's
    do across its rows. Written after Nsight Compute put the small-batch kernels at M = 6 at
    20-30 % of the H200's DRAM throughput, latency-bound with too few loads in flight while
    their CTAs run in waves (benchmarks/results/pq2_linear_h200_notes.md, fourteenth
    session). The same exact int32 group sums, added in the order of its K slices. Runs only
    where ``VLLM_PRISM_PQ2_KERNEL`` names it until a GPU run has timed it."""

    name = "mma_persist_cuda"
    in_auto = False
    variant = 5


class MmaLeanCudaA8Kernel(MmaSmallCudaA8Kernel):
    """M = 1..8: ``mma_stream_cuda``'s loads (8 bytes of codes a lane per row and 128-group,
    the MMA's k permuted within each group) on the GEMV's recipe (op variant 6,
    csrc/pq2/mma_lean.cu): a warp's pass is one unit of four groups (the four groups' fp16
    scales of a row in one 8-byte load), the next unit's loads issued before the current
    one's compute, its registers capped at 96 so that 21 warps stay resident on a
    multiprocessor, and the K-split warps of a tile add their partial sums in shared memory
    in K order; the geometry is the one that keeps the most warps resident in one wave of
    CTAs. Written after Nsight Compute put ``mma_stream_cuda`` at 22-30 % of the H200's DRAM
    throughput at M = 6 with 16 warps a multiprocessor (125 registers) whose load and compute
    phases stay locked. Needs K % 512 == 0. The automatic choice for M in
    ``MMA_LEAN_AUTO_M`` (2..8): on the H200 (benchmarks/results/pq2_small_sweep_h200.md,
    kernels alone) 1.05-1.34x the best of the other small-batch kernels at M = 2..8 on every
    layer shape (with its best geometry) and 1.20x on the LM head at M = 6, at M = 2 faster
    than the GEMV, at M = 1 slower on K = 5120 (the GEMV keeps M = 1); exact through the op
    on the H200 (tests/kernels/test_pq2_linear.py); 1.13x the previous automatic choice in a
    CUDA graph of a layer's torch-op linears with the engine's signs and producer prologues
    at M = 6 (benchmarks/results/pq2_chain_h200_m6_lean.md); through vLLM (27B-shaped file,
    INT8 cache, side-by-side engines measured in both orders, the faster round of each) a
    6-token DFlash verification step at 6.91 against 7.78 ms (4K context) and 7.63 against
    7.70 ms (32K), a batch-8 decode step at 6.51 against 7.12 ms (e2e_h200_notes.md,
    twenty-first session)."""

    name = "mma_lean_cuda"
    variant = 6
    auto_min_m, auto_max_m = MMA_LEAN_AUTO_M

    @classmethod
    def can_implement(cls, c):
        if c.m > 8:
            return False, f"M = {c.m} outside 1..8"
        if c.k % 512:
            return False, f"K = {c.k} is not a multiple of 512"
        ok, why = super().can_implement(c)
        if ok and not c.scales_by_four:
            return False, ("the scale plane is not 8-byte aligned with a row stride that is a "
                           "multiple of 4 (the kernel loads four scales at once)")
        return ok, why


class TorchKernel(PQ2LinearKernel):
    """Exact reference: transform in fp32, dense dequantized weight, one matmul. Any device."""

    name = "torch"

    @classmethod
    def is_supported(cls, capability):
        return True, ""

    @classmethod
    def can_implement(cls, c):
        return True, ""

    @classmethod
    def make_activation(cls, x, w, prologue=NO_PROLOGUE):
        act = transform_activation_torch(x, w.signs, w.hadamard_block, ActKind.FLOAT,
                                         out_dtype=torch.float32, prologue=prologue)
        act.dtype = x.dtype  # the output dtype the kernel returns
        return act

    @classmethod
    def run(cls, act, w, bias, out_dtype):
        y = act.data.float() @ w.dequantize(torch.float32).T
        if bias is not None:
            y = y + bias.float()
        return y.to(out_dtype)


# Automatic order (H200 measurements in benchmarks/results/pq2_linear_h200.md, each choice
# also timed through vLLM in e2e_h200.md): where vllm_prism._C is built, the short-pass
# small-batch kernel (mma_lean_cuda) first at M = 2..8 where K % 512 == 0 (every Bonsai 2
# linear: 1.10-1.13x the kernels below for a verification step through vLLM), the CUDA C++
# GEMV (gemv_cuda) at M = 1..2, the CUDA C++ small-batch kernel (mma_small_cuda) at M = 3..8
# (its streaming variant mma_stream_cuda from K = 6144, and at M = 2 past K = 8192), the
# CUDA C++ tensor-core kernel (mma_cuda) past it up to M = 511 and from M = 512 on compute
# capability 9.0 with VLLM_PRISM_PQ2_FOLD_PREFILL=1 the warpgroup-MMA prefill with folded
# scales (wgmma_fold) where the codes are ternary, else the dequantize-then-cuBLAS prefill
# (gemm_dq). Without _C: the Triton GEMV up to M = 2 (4 on large N; the fp32 GEMV is
# issue-bound, see triton_gemv), then the Triton int8 tensor-core kernels (1.1-1.5x faster than
# bf16 at every M measured), gemm_dq from M = 512.
# The bf16/fp16 kernels (*_a16) stay for the reference precision: VLLM_PRISM_PQ2_KERNEL=mma_a16
# / gemm_a16 / gemv_a16; the pipelined small-batch variant (mma_small_pipe_cuda), the
# equal-share one (mma_bulk_cuda), the resident streaming one (mma_persist_cuda), the GEMV with
# the producer in its launch (gemv_fused_cuda), the FP8 prefill GEMM (gemm_fp8) and the exact
# warpgroup-MMA prefill GEMM (wgmma_cuda) run only where named.
KERNELS: list[type[PQ2LinearKernel]] = [
    PTQ1GemvKernel, MmaLeanCudaA8Kernel, MmaStreamCudaA8Kernel, GemvCudaA8Kernel,
    MmaSmallCudaA8Kernel, GemvA8Kernel, GemvA16Kernel,
    WgmmaFoldKernel, GemmDqKernel, MmaCudaA8Kernel, MmaA8Kernel, MmaA16Kernel, GemmA8Kernel,
    GemmA16Kernel,
    MmaSmallPipeCudaA8Kernel, MmaBulkCudaA8Kernel, MmaPersistCudaA8Kernel,
    GemvFusedCudaKernel, GemmFp8Kernel, WgmmaCudaKernel, TorchKernel,
]
_BY_NAME = {k.name: k for k in KERNELS}


def _num_sms(device: torch.device) -> int:
    """Multiprocessors the tile configs plan for (an H200's 132 off the GPU)."""
    return sm_count(device) or 132


_logged: set[tuple] = set()


def _log_once(level: int, key: tuple, msg: str, *args: object) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.log(level, msg, *args)


def _accepts(kernel: type[PQ2LinearKernel], c: PQ2LinearConfig) -> tuple[bool, str]:
    ok, why = kernel.is_supported(c.capability)
    if ok:
        ok, why = kernel.can_implement(c)
    return ok, why


@functools.lru_cache(maxsize=4096)
def _select(c: PQ2LinearConfig, forced: str) -> type[PQ2LinearKernel]:
    """The first forced kernel that accepts ``c``, else the first of the automatic order."""
    for name in _forced_names(forced):
        kernel = _BY_NAME[name]
        ok, why = _accepts(kernel, c)
        if ok:
            _log_once(logging.INFO, ("forced", name, c.m, c.n, c.k, c.fmt),
                      "PQ2 linear %s M=%d N=%d K=%d: kernel %s (VLLM_PRISM_PQ2_KERNEL)",
                      c.fmt, c.m, c.n, c.k, name)
            return kernel
        # one warning per named kernel (a prefill-only kernel cannot run any decode call),
        # the other shapes it cannot run at debug level
        first = ("forced-no", name) not in _logged
        _log_once(logging.WARNING if first else logging.DEBUG,
                  ("forced-no", name) if first else ("forced-no", name, c.m, c.n, c.k, c.fmt),
                  "VLLM_PRISM_PQ2_KERNEL: %s cannot run %s M=%d N=%d K=%d (%s); trying the "
                  "next choice%s", name, c.fmt, c.m, c.n, c.k, why,
                  " (other calls it cannot run are logged at debug level)" if first else "")
    for kernel in KERNELS:
        ok, why = kernel.auto_accepts(c)
        if ok:
            ok, why = _accepts(kernel, c)
        if ok:
            _log_once(logging.INFO, ("chosen", kernel.name, c.fmt, c.dtype, c.device_type,
                                     _m_bucket(c.m)),
                      "PQ2 linear %s M=%d N=%d K=%d %s: kernel %s", c.fmt, c.m, c.n, c.k,
                      str(c.dtype).removeprefix("torch."), kernel.name)
            return kernel
        _log_once(logging.DEBUG, ("skip", kernel.name, why),
                  "PQ2 linear: kernel %s passed over: %s", kernel.name, why)
    raise RuntimeError("no PQ2 linear kernel accepted the call")  # TorchKernel always does


def _forced_names(forced: str) -> list[str]:
    """The kernels ``VLLM_PRISM_PQ2_KERNEL`` names, in order (comma-separated; "auto" or
    empty: none), unknown names dropped with a warning."""
    names = [x.strip() for x in forced.split(",") if x.strip() and x.strip() != "auto"]
    for name in names:
        if name not in _BY_NAME:
            _log_once(logging.WARNING, ("unknown", name),
                      "VLLM_PRISM_PQ2_KERNEL names %s, which is not a kernel; choose from %s "
                      "or auto", name, ", ".join(_BY_NAME))
    return [x for x in names if x in _BY_NAME]


def _m_bucket(m: int) -> int:
    return m if m <= 1 else (2 if m <= MMA_MAX_M else 3)


def select_kernel(m: int, w: Weight, dtype: torch.dtype,
                  prologue: Prologue = NO_PROLOGUE) -> type[PQ2LinearKernel]:
    """The kernel class that runs an [m, K] activation of ``dtype`` (made with ``prologue``)
    through ``w``."""
    return _select(PQ2LinearConfig.of(m, w, dtype, prologue), envs.VLLM_PRISM_PQ2_KERNEL)


def pq2_linear(x: torch.Tensor, w: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = W_st @ Hblk(s * x) + bias`` for x [..., K]; returns [..., N] in x's dtype.

    The transform (when ``w`` carries signs) runs in the producer launch of the chosen kernel.
    """
    return pq2_linear_fused(x, w, bias)[0]


def pq2_linear_fused(x: torch.Tensor, w: Weight, bias: torch.Tensor | None = None,
                     prologue: Prologue = NO_PROLOGUE
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``W_st @ Hblk(s * prologue(x)) + bias``; when the prologue adds a residual, the sum
    ``x' + residual`` (the next residual); with ``prologue.return_input``, ``prologue(x)`` in
    x's dtype (else None). x is [..., K], or [..., 2K] for a glu prologue; the prologue runs
    in the producer launch of the chosen kernel."""
    width = 2 * w.k if prologue.glu else w.k
    if x.shape[-1] != width:
        raise ValueError(f"x has K = {x.shape[-1]}, the {w.fmt} weight [{w.n}, {w.k}] needs "
                         f"{width}{' (gate and up halves)' if prologue.glu else ''}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, width)
    if prologue.residual is not None:
        prologue = dataclasses.replace(prologue, residual=prologue.residual.reshape(-1, w.k))
    if prologue.gate is not None:
        prologue = dataclasses.replace(prologue, gate=prologue.gate.reshape(-1, w.k))
    kernel = select_kernel(x2.shape[0], w, x.dtype, prologue)
    act = kernel.make_activation(x2, w, prologue)
    y = kernel.run(act, w, bias, x.dtype).reshape(*lead, w.n)
    res = None if act.residual is None else act.residual.reshape(*lead, w.k)
    inp = None if act.linear_input is None else act.linear_input.reshape(*lead, w.k)
    return y, res, inp


def pq2_linear_from_activation(act: PQ2Activation, w: Weight,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    """Run a producer-made activation (``select_kernel(...).make_activation``) through w."""
    kernel = select_kernel(act.m, w, act.dtype)
    if kernel.act_kind != act.kind:
        raise ValueError(f"kernel {kernel.name} reads {kernel.act_kind.name} activations, "
                         f"got {act.kind.name}")
    return kernel.run(act, w, bias, act.dtype)
