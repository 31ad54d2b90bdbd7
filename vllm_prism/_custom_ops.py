"""Python face of vllm-prism's torch custom ops: the compiled ones in vllm_prism._C, and the
registered ops that the model's forward calls under torch.compile.

``torch.ops.vllm_prism.pq2_linear`` is the linear op of every ternary layer. It is registered
the way vLLM registers its own ops (``direct_register_custom_op``, with a fake
implementation), so Dynamo treats it as opaque, CUDA graphs capture the kernels it launches,
and the kernel is chosen by the number of rows M inside the op (as vLLM's
``rocm_unquantized_gemm`` does), never by a Python branch that a traced graph would freeze.
Its inputs are the layer's prepared planes (``PQ2Weight``: int32 codes, fp16 scales) and the
optional Hadamard signs, all registered on the layer.

Siblings fuse what feeds a linear in the model into the producer launch of its kernel:
``pq2_glu_linear`` (the SiLU-and-multiply of the MLP, for ``down_proj``),
``pq2_add_rmsnorm_linear`` (residual add + RMSNorm, for ``gate_up_proj``; it also returns
the new residual) and ``pq2_gated_linear`` (the output gate, after an optional per-group
RMSNorm: the attention's ``o_proj`` and the Gated DeltaNet's gated norm before
``out_proj``), so neither the activation, the gate nor the norm is a kernel of its own.
``dense_linear`` runs the float projections Bonsai keeps (``in_proj_ba``) on CUDA: ``F.linear``,
or the small-M GEMV of vllm_prism.kernels.dense_gemv where ``VLLM_PRISM_DENSE_GEMV`` picks it.
For the Gated DeltaNet, ``pq2_add_rmsnorm_linear_input`` also returns the normalized input
(``in_proj_qkvz``'s producer stores it) and ``dense_linear_halves`` runs ``in_proj_ba`` on it,
writing ``b`` and ``a`` contiguous and zeroing the core's output buffer in the same launch.

The compiled extension is optional: a CPU install, or a CUDA install built without a
toolkit, has no ``vllm_prism._C``; callers get the exact torch reference there.
"""

from __future__ import annotations

import functools
import importlib
import logging

import torch

from vllm_prism.gguf.codecs_torch import dequantize_to
from vllm_prism.gguf.constants import GGMLType

logger = logging.getLogger(__name__)

OP_NAMESPACE = "vllm_prism"


@functools.cache
def has_compiled_ops() -> bool:
    """Whether vllm_prism._C was built and loads in this process."""
    try:
        importlib.import_module("vllm_prism._C")
    except ImportError as e:
        logger.debug("vllm_prism._C is not available (%s); using the Triton/torch paths", e)
        return False
    return hasattr(torch.ops, "_C_prism") and hasattr(torch.ops._C_prism, "pq2_dequantize")


def has_compiled_op(name: str) -> bool:
    """Whether vllm_prism._C holds the op ``torch.ops._C_prism.<name>`` (e.g. pq2_mma_int8,
    pq2_gemv_int8 of csrc/pq2)."""
    return has_compiled_ops() and hasattr(torch.ops._C_prism, name)


def pq2_dequantize(raw: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dense [rows, K] weights from packed PQ2_0 rows (uint8 [rows, K/128*34])."""
    if raw.is_cuda and has_compiled_ops():
        return torch.ops._C_prism.pq2_dequantize(raw.contiguous(), dtype)
    return dequantize_to(raw, GGMLType.PQ2_0, dtype)


# ------------------------------------------------------------------ registered forward ops


def _weight(codes: torch.Tensor, scales: torch.Tensor, signs: torch.Tensor | None,
            hadamard_block: int):
    from vllm_prism.kernels.pq2.layout import PQ2Weight

    return PQ2Weight.of_planes(codes, scales, signs, hadamard_block or None)


def _pq2_linear_impl(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                     signs: torch.Tensor | None, bias: torch.Tensor | None,
                     hadamard_block: int) -> torch.Tensor:
    from vllm_prism.kernels.pq2.dispatch import pq2_linear

    return pq2_linear(x, _weight(codes, scales, signs, hadamard_block), bias)


def _linear_out(x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The fake result of every linear op: x's leading dims, the weight's N rows."""
    return x.new_empty((*x.shape[:-1], codes.shape[0]))


def _pq2_linear_fake(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                     signs: torch.Tensor | None, bias: torch.Tensor | None,
                     hadamard_block: int) -> torch.Tensor:
    return _linear_out(x, codes)


def _pq2_glu_linear_impl(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                         signs: torch.Tensor | None, bias: torch.Tensor | None,
                         hadamard_block: int) -> torch.Tensor:
    from vllm_prism.kernels.pq2.dispatch import pq2_linear_fused
    from vllm_prism.kernels.pq2.hadamard import Prologue

    w = _weight(codes, scales, signs, hadamard_block)
    return pq2_linear_fused(x, w, bias, Prologue(glu=True))[0]


def _add_rmsnorm_linear(x: torch.Tensor, residual: torch.Tensor, rms_weight: torch.Tensor,
                        rms_offset: float, eps: float, codes: torch.Tensor,
                        scales: torch.Tensor, signs: torch.Tensor | None,
                        bias: torch.Tensor | None, hadamard_block: int, return_input: bool
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(linear(RMSNorm(x + residual)), x + residual, the normalized input or None): the two
    add-RMSNorm ops' body."""
    from vllm_prism.kernels.pq2.dispatch import pq2_linear_fused
    from vllm_prism.kernels.pq2.hadamard import Prologue

    w = _weight(codes, scales, signs, hadamard_block)
    pro = Prologue(residual=residual, rms_weight=rms_weight, rms_offset=rms_offset, eps=eps,
                   return_input=return_input)
    return pq2_linear_fused(x, w, bias, pro)


def _pq2_add_rmsnorm_linear_impl(x: torch.Tensor, residual: torch.Tensor,
                                 rms_weight: torch.Tensor, rms_offset: float, eps: float,
                                 codes: torch.Tensor, scales: torch.Tensor,
                                 signs: torch.Tensor | None, bias: torch.Tensor | None,
                                 hadamard_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _add_rmsnorm_linear(x, residual, rms_weight, rms_offset, eps, codes, scales, signs,
                               bias, hadamard_block, False)[:2]


@functools.cache
def _log_input_norm(n: int, k: int) -> None:
    logger.info("PQ2 linear: the input norm runs in the producer of the %dx%d linear, which "
                "returns it for the float projection beside it", n, k)


def _pq2_add_rmsnorm_linear_input_impl(x: torch.Tensor, residual: torch.Tensor,
                                       rms_weight: torch.Tensor, rms_offset: float, eps: float,
                                       codes: torch.Tensor, scales: torch.Tensor,
                                       signs: torch.Tensor | None, bias: torch.Tensor | None,
                                       hadamard_block: int
                                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pq2_add_rmsnorm_linear`` that also returns the normalized input (x's dtype), for a
    float projection that reads it: the producer stores it, no launch of its own."""
    _log_input_norm(codes.shape[0], codes.shape[1] * 16)
    return _add_rmsnorm_linear(x, residual, rms_weight, rms_offset, eps, codes, scales, signs,
                               bias, hadamard_block, True)


def _pq2_add_rmsnorm_linear_input_fake(x: torch.Tensor, residual: torch.Tensor,
                                       rms_weight: torch.Tensor, rms_offset: float, eps: float,
                                       codes: torch.Tensor, scales: torch.Tensor,
                                       signs: torch.Tensor | None, bias: torch.Tensor | None,
                                       hadamard_block: int
                                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _linear_out(x, codes), torch.empty_like(residual), torch.empty_like(x)


def _pq2_add_rmsnorm_linear_fake(x: torch.Tensor, residual: torch.Tensor,
                                 rms_weight: torch.Tensor, rms_offset: float, eps: float,
                                 codes: torch.Tensor, scales: torch.Tensor,
                                 signs: torch.Tensor | None, bias: torch.Tensor | None,
                                 hadamard_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _linear_out(x, codes), torch.empty_like(residual)


def _pq2_gated_linear_impl(x: torch.Tensor, gate: torch.Tensor, rms_weight: torch.Tensor | None,
                           rms_group: int, eps: float, gate_sigmoid: bool, codes: torch.Tensor,
                           scales: torch.Tensor, signs: torch.Tensor | None,
                           bias: torch.Tensor | None, hadamard_block: int) -> torch.Tensor:
    from vllm_prism.kernels.pq2.dispatch import pq2_linear_fused
    from vllm_prism.kernels.pq2.hadamard import Prologue

    w = _weight(codes, scales, signs, hadamard_block)
    pro = Prologue(rms_weight=rms_weight, rms_group=rms_group, eps=eps, gate=gate,
                   gate_sigmoid=gate_sigmoid)
    return pq2_linear_fused(x, w, bias, pro)[0]


def _pq2_gated_linear_fake(x: torch.Tensor, gate: torch.Tensor, rms_weight: torch.Tensor | None,
                           rms_group: int, eps: float, gate_sigmoid: bool, codes: torch.Tensor,
                           scales: torch.Tensor, signs: torch.Tensor | None,
                           bias: torch.Tensor | None, hadamard_block: int) -> torch.Tensor:
    return _linear_out(x, codes)


def _small_m_gemv_takes(x2: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None) -> bool:
    """Whether ``VLLM_PRISM_DENSE_GEMV`` picks the small-M GEMV for x2 [M, K] (``auto``:
    M <= ``AUTO_M``; ``triton``: M <= 16) and the call fits (a skinny weight, on CUDA)."""
    from vllm_prism import envs
    from vllm_prism.kernels.dense_gemv import AUTO_M, MAX_M, small_m_problem

    limit = {"auto": AUTO_M, "triton": MAX_M}.get(envs.VLLM_PRISM_DENSE_GEMV, 0)
    return x2.shape[0] <= limit and small_m_problem(x2, weight, bias) is None


def dense_linear_impl(x: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` of a float projection, or the one-launch small-M GEMV where
    ``VLLM_PRISM_DENSE_GEMV`` picks it for this M."""
    x2 = x.reshape(-1, x.shape[-1])
    if _small_m_gemv_takes(x2, weight, bias):
        from vllm_prism.kernels.dense_gemv import small_m_linear

        return small_m_linear(x2, weight, bias).reshape(*x.shape[:-1], weight.shape[0])
    return torch.nn.functional.linear(x, weight, bias)


def _dense_linear_fake(x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def dense_linear_halves_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             clear_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For x [M, K] and an even N: ``(y [2, M, N/2], zeros [M, clear_width])`` where
    ``y[p] = (x @ weight.T + bias)[:, p * N/2:(p + 1) * N/2]``, each half contiguous: what
    vLLM's Gated DeltaNet core takes (``b``, ``a`` and its zeroed output buffer), in the
    small-M GEMV's one launch where it runs, else ``F.linear``, a copy and a fill."""
    if _small_m_gemv_takes(x, weight, bias) and weight.shape[0] % 2 == 0:
        from vllm_prism.kernels.dense_gemv import small_m_linear

        zeros = torch.empty(x.shape[0], clear_width, dtype=x.dtype, device=x.device)
        return small_m_linear(x, weight, bias, halves=True, clear=zeros), zeros
    return halves_and_zeros(torch.nn.functional.linear(x, weight, bias), clear_width)


def halves_and_zeros(y: torch.Tensor, clear_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y's two column halves as [2, M, N/2], each contiguous; zeros [M, clear_width])``
    for y [M, N]: a copy and a fill, what vLLM's Gated DeltaNet does after ``in_proj_ba``."""
    m = y.shape[0]
    halves = y.view(m, 2, y.shape[-1] // 2).transpose(0, 1).contiguous()
    return halves, torch.zeros(m, clear_width, dtype=y.dtype, device=y.device)


def _dense_linear_halves_fake(x: torch.Tensor, weight: torch.Tensor,
                              bias: torch.Tensor | None,
                              clear_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    m = x.shape[0]
    return (x.new_empty((2, m, weight.shape[0] // 2)), x.new_empty((m, clear_width)))


@functools.cache
def _library() -> torch.library.Library:
    return torch.library.Library(OP_NAMESPACE, "FRAGMENT")  # kept alive by the cache


@functools.cache
def register_ops() -> None:
    """Register the forward ops once per process (vLLM's ``direct_register_custom_op``, on
    the current platform's dispatch key). The prism quantization method calls it when it
    prepares its weights, outside any traced code; the forward calls the ops through
    ``torch.ops.vllm_prism`` directly."""
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import direct_register_custom_op

    lib = _library()
    ops = {"pq2_linear": (_pq2_linear_impl, _pq2_linear_fake),
           "pq2_glu_linear": (_pq2_glu_linear_impl, _pq2_linear_fake),
           "pq2_add_rmsnorm_linear": (_pq2_add_rmsnorm_linear_impl,
                                      _pq2_add_rmsnorm_linear_fake),
           "pq2_add_rmsnorm_linear_input": (_pq2_add_rmsnorm_linear_input_impl,
                                            _pq2_add_rmsnorm_linear_input_fake),
           "pq2_gated_linear": (_pq2_gated_linear_impl, _pq2_gated_linear_fake),
           "dense_linear": (dense_linear_impl, _dense_linear_fake),
           "dense_linear_halves": (dense_linear_halves_impl, _dense_linear_halves_fake)}
    for name, (impl, fake) in ops.items():
        direct_register_custom_op(name, impl, mutates_args=[], fake_impl=fake, target_lib=lib)
        if current_platform.dispatch_key != "CPU":  # CPU tensors on a GPU host: torch path
            lib.impl(name, impl, dispatch_key="CPU")

