"""The Gated DeltaNet recurrence of a speculative verification step, read in place.

A verification step feeds each sequence's k + 1 tokens through the Gated DeltaNet: from the
state after the last accepted token, each token decays the state by
``exp(-exp(A_log) * softplus(a + dt_bias))``, writes ``sigmoid(b) * (v - S k)`` along ``k``
(q and k L2-normalized, q scaled by ``K ** -0.5``), reads ``o = S q``, and the state after
each token is stored in that token's slot of the state pool, so that the next step can start
from whichever token is accepted.

vLLM 0.32 runs this as a fused CUDA kernel with one program per value head, or (its Triton
path) after copying q, k, v, a and b into contiguous tensors, and copies the result into the
layer's output buffer: ~580 us of copies a 6-token step of the 27B model on the H200
(benchmarks/results/e2e_h200_notes.md, fifteenth session). This kernel reads q, k and v from
the convolution's output rows, a and b where the projection left them, and writes the
layer's output buffer; one program per (sequence, value head, ``BV`` value rows) holds its
slice of the state in fp32 registers across the tokens, which it loads all at once first.
"""

from __future__ import annotations

import torch

from vllm_prism.kernels.common import HAS_TRITON, next_power_of_2, triton_can_run

if HAS_TRITON:
    import triton
    import triton.language as tl

# value rows of the state per program (more programs than vLLM's 32 for a batch of one)
BLOCK_V = 16
# softplus(x) = x above this (as torch.nn.functional.softplus's default threshold)
SOFTPLUS_THRESHOLD = 20.0


if HAS_TRITON:

    @triton.jit
    def _gdn_verify_kernel(qkv, qkv_stride, a, a_stride, b, b_stride, A_log, dt_bias,
                           state, state_stride, indices, indices_stride, num_accepted,
                           cu_seqlens, out, out_stride, scale,
                           H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           BV: tl.constexpr, TMAX: tl.constexpr, THRESHOLD: tl.constexpr):
        i_v = tl.program_id(0)
        i_nh = tl.program_id(1)
        i_n = i_nh // HV
        i_hv = i_nh % HV
        i_h = i_hv // (HV // H)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        n_tok = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
        first = tl.load(num_accepted + i_n, mask=n_tok > 0, other=0).to(tl.int64) - 1
        slot0 = tl.load(indices + i_n * indices_stride + first, mask=first >= 0,
                        other=0).to(tl.int64)
        if (n_tok > 0) & (slot0 > 0):  # a padded sequence has no tokens or the null slot 0
            o_t = tl.arange(0, TMAX)
            o_k = tl.arange(0, K)
            o_v = i_v * BV + tl.arange(0, BV)
            t_ok = o_t < n_tok
            rows = qkv + (bos + o_t)[:, None] * qkv_stride
            # every token's q, k and v slice at once, [TMAX, K] / [TMAX, BV]
            q = tl.load(rows + i_h * K + o_k[None, :], mask=t_ok[:, None], other=0.0)
            k = tl.load(rows + (H + i_h) * K + o_k[None, :], mask=t_ok[:, None], other=0.0)
            v = tl.load(rows + 2 * H * K + i_hv * V + o_v[None, :], mask=t_ok[:, None],
                        other=0.0).to(tl.float32)
            q = q.to(tl.float32)
            k = k.to(tl.float32)
            q = q * (tl.rsqrt(tl.sum(q * q, 1) + 1e-6) * scale)[:, None]
            k = k * tl.rsqrt(tl.sum(k * k, 1) + 1e-6)[:, None]
            x = (tl.load(a + (bos + o_t) * a_stride + i_hv, mask=t_ok, other=0.0).to(tl.float32)
                 + tl.load(dt_bias + i_hv).to(tl.float32))
            softplus = tl.where(x <= THRESHOLD, tl.log(1.0 + tl.exp(x)), x)
            decay = tl.exp(-tl.exp(tl.load(A_log + i_hv).to(tl.float32)) * softplus)
            beta = tl.sigmoid(tl.load(b + (bos + o_t) * b_stride + i_hv, mask=t_ok,
                                      other=0.0).to(tl.float32))
            tile = i_hv * V * K + o_v[:, None] * K + o_k[None, :]
            s = tl.load(state + slot0 * state_stride + tile).to(tl.float32)  # [BV, K]
            for t in range(0, n_tok):
                pick = o_t == t
                k_t = tl.sum(tl.where(pick[:, None], k, 0.0), 0)
                q_t = tl.sum(tl.where(pick[:, None], q, 0.0), 0)
                v_t = tl.sum(tl.where(pick[:, None], v, 0.0), 0)
                s = s * tl.sum(tl.where(pick, decay, 0.0))
                u = (v_t - tl.sum(s * k_t[None, :], 1)) * tl.sum(tl.where(pick, beta, 0.0))
                s = s + u[:, None] * k_t[None, :]
                o = tl.sum(s * q_t[None, :], 1)
                tl.store(out + (bos + t) * out_stride + i_hv * V + o_v,
                         o.to(out.dtype.element_ty))
                slot = tl.load(indices + i_n * indices_stride + t).to(tl.int64)
                if slot > 0:
                    tl.store(state + slot * state_stride + tile, s.to(state.dtype.element_ty))


def gdn_verify_problem(qkv: torch.Tensor, state: torch.Tensor, indices: torch.Tensor,
                       out: torch.Tensor, num_k_heads: int, head_k_dim: int,
                       head_v_dim: int) -> str | None:
    """Why :func:`gdn_verify` cannot take this call (None: it can)."""
    hv = out.size(1) if out.dim() == 3 else 0
    if out.dim() != 3 or out.size(2) != head_v_dim or out.stride(2) != 1 \
            or out.stride(1) != head_v_dim:
        return f"the output buffer {tuple(out.shape)} is not [tokens, heads, {head_v_dim}] rows"
    if num_k_heads < 1 or hv % num_k_heads:
        return f"{hv} value heads are not a multiple of {num_k_heads} key heads"
    for name, d in (("key", head_k_dim), ("value", head_v_dim)):
        if d < 16 or d & (d - 1):
            return f"the {name} head size {d} is not a power of two >= 16"
    if qkv.dim() != 2 or qkv.stride(1) != 1 \
            or qkv.size(1) != 2 * num_k_heads * head_k_dim + hv * head_v_dim:
        return (f"the convolution output {tuple(qkv.shape)} is not [tokens, "
                f"{2 * num_k_heads * head_k_dim + hv * head_v_dim}] rows")
    if tuple(state.shape[1:]) != (hv, head_v_dim, head_k_dim) or not state[0].is_contiguous():
        return f"the state pool {tuple(state.shape)} is not [slots, {hv}, {head_v_dim}, " \
               f"{head_k_dim}] contiguous slots"
    if indices.dim() != 2:
        return f"the state indices {tuple(indices.shape)} are not [sequences, tokens]"
    if not triton_can_run(out.device):
        return f"Triton cannot run on {out.device} here"
    return None


def gdn_verify(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
               dt_bias: torch.Tensor, state: torch.Tensor, indices: torch.Tensor,
               num_accepted: torch.Tensor, cu_seqlens: torch.Tensor, out: torch.Tensor,
               num_k_heads: int, head_k_dim: int, head_v_dim: int) -> None:
    """The verification step's recurrence (module docstring), in place: ``out[tokens, HV, V]``
    and the state pool ``state[slots, HV, V, K]`` at ``indices[n, t]`` (a slot <= 0 is not
    stored; a sequence whose starting slot ``indices[n, num_accepted[n] - 1]`` is <= 0 is
    skipped). ``qkv`` is the convolution's output rows ``[q | k | v]``, ``a`` and ``b`` are
    ``[tokens, HV]`` (any row stride), ``cu_seqlens`` has one entry more than sequences.
    ValueError where :func:`gdn_verify_problem` says it cannot."""
    problem = gdn_verify_problem(qkv, state, indices, out, num_k_heads, head_k_dim, head_v_dim)
    if problem is not None:
        raise ValueError(f"gdn_verify: {problem}")
    launch_gdn_verify(qkv, a, b, A_log, dt_bias, state, indices, num_accepted, cu_seqlens, out,
                      num_k_heads, head_k_dim, head_v_dim)


def launch_gdn_verify(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                      dt_bias: torch.Tensor, state: torch.Tensor, indices: torch.Tensor,
                      num_accepted: torch.Tensor, cu_seqlens: torch.Tensor, out: torch.Tensor,
                      num_k_heads: int, head_k_dim: int, head_v_dim: int) -> None:
    """:func:`gdn_verify` without its check, for a caller that has run
    :func:`gdn_verify_problem` on the call already."""
    heads = out.size(1)
    sequences = cu_seqlens.numel() - 1
    block_v = min(BLOCK_V, head_v_dim)
    grid = (head_v_dim // block_v, sequences * heads)
    _gdn_verify_kernel[grid](
        qkv, qkv.stride(0), a, a.stride(0), b, b.stride(0), A_log, dt_bias,
        state, state.stride(0), indices, indices.stride(0), num_accepted, cu_seqlens,
        out, out.stride(0), head_k_dim ** -0.5,
        H=num_k_heads, HV=heads, K=head_k_dim, V=head_v_dim, BV=block_v,
        TMAX=next_power_of_2(max(indices.size(1), 2)), THRESHOLD=SOFTPLUS_THRESHOLD,
        num_warps=4)
