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
slice of the state in fp32 registers across the tokens and reads each token's inputs in its
loop, the next token's before this token's work (the structure of vLLM's Triton kernel,
without its copies, with that prefetch).
A first design that loaded every token's inputs at once and picked each token's out of the
tile with a reduction ran 1.30 ms a step on the H200, against vLLM's fused CUDA kernel's
0.75 ms (benchmarks/results/e2e_h200_notes.md, sixteenth session).
"""

from __future__ import annotations

import torch

from vllm_prism.kernels.common import HAS_TRITON, triton_can_run

if HAS_TRITON:
    import triton
    import triton.language as tl

# value rows of the state per program, its warps (vLLM's Triton kernel: 32, 4), and whether
# the next token's loads go out before a token's work: the fastest of the sweep of
# benchmarks/kernels/bench_gdn_verify.py on the H200 (12.0 us for one sequence's 6 tokens
# of the 27B model's 48 heads against 13.8 us at 32 rows and 4 warps, 19.9 us for vLLM's
# CUDA kernel)
BLOCK_V = 16
NUM_WARPS = 2
PREFETCH = True
# softplus(x) = x above this (as torch.nn.functional.softplus's default threshold)
SOFTPLUS_THRESHOLD = 20.0


if HAS_TRITON:

    @triton.jit
    def _token_inputs(p_q, p_k, p_v, p_a, p_b, p_slot):
        """One token's q, k, v, a, b and state slot, as stored."""
        return (tl.load(p_q), tl.load(p_k), tl.load(p_v), tl.load(p_a), tl.load(p_b),
                tl.load(p_slot))

    @triton.jit
    def _gdn_verify_kernel(qkv, qkv_stride, a, a_stride, b, b_stride, A_log, dt_bias,
                           state, state_stride, indices, indices_stride, num_accepted,
                           cu_seqlens, out, out_stride, scale,
                           H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           BV: tl.constexpr, THRESHOLD: tl.constexpr,
                           PREFETCH: tl.constexpr):
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
            o_k = tl.arange(0, K)
            o_v = i_v * BV + tl.arange(0, BV)
            tile = i_hv * V * K + o_v[:, None] * K + o_k[None, :]
            s = tl.load(state + slot0 * state_stride + tile).to(tl.float32)  # [BV, K]
            neg_a = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))
            bias = tl.load(dt_bias + i_hv).to(tl.float32)
            # token t's q, k, v in the convolution's output row bos + t, a and b where the
            # projection left them, its output row in the layer's buffer: each pointer moves
            # one row a token. The loads of token t + 1 are issued before token t's work with
            # PREFETCH (Triton does not pipeline this loop: its loads feed no dot), after it
            # without.
            p_q = qkv + bos * qkv_stride + i_h * K + o_k
            p_k = p_q + H * K
            p_v = qkv + bos * qkv_stride + 2 * H * K + i_hv * V + o_v
            p_a = a + bos * a_stride + i_hv
            p_b = b + bos * b_stride + i_hv
            p_o = out + bos * out_stride + i_hv * V + o_v
            p_slot = indices + i_n * indices_stride
            q_n, k_n, v_n, a_n, b_n, slot_n = _token_inputs(p_q, p_k, p_v, p_a, p_b, p_slot)
            for t in range(0, n_tok):
                q = q_n.to(tl.float32)
                k = k_n.to(tl.float32)
                v = v_n.to(tl.float32)
                x = a_n.to(tl.float32) + bias
                beta = tl.sigmoid(b_n.to(tl.float32))
                slot = slot_n.to(tl.int64)
                # the pointers move to the next token's row, or stay on the last row after it
                # (its reload is never used), so no load needs a mask
                nxt = (t + 1 < n_tok).to(tl.int64)
                p_q += nxt * qkv_stride
                p_k += nxt * qkv_stride
                p_v += nxt * qkv_stride
                p_a += nxt * a_stride
                p_b += nxt * b_stride
                p_slot += nxt
                if PREFETCH:
                    q_n, k_n, v_n, a_n, b_n, slot_n = _token_inputs(p_q, p_k, p_v, p_a, p_b,
                                                                    p_slot)
                softplus = tl.where(x <= THRESHOLD, tl.log(1.0 + tl.exp(x)), x)
                # the order of vLLM's kernel: normalize, then scale
                q = q * tl.rsqrt(tl.sum(q * q) + 1e-6)
                k = k * tl.rsqrt(tl.sum(k * k) + 1e-6)
                q = q * scale
                s = s * tl.exp(neg_a * softplus)
                u = (v - tl.sum(s * k[None, :], 1)) * beta
                s = s + u[:, None] * k[None, :]
                tl.store(p_o, tl.sum(s * q[None, :], 1).to(out.dtype.element_ty))
                p_o += out_stride
                if slot > 0:
                    tl.store(state + slot * state_stride + tile, s.to(state.dtype.element_ty))
                if not PREFETCH:
                    q_n, k_n, v_n, a_n, b_n, slot_n = _token_inputs(p_q, p_k, p_v, p_a, p_b,
                                                                    p_slot)


def gdn_verify_problem(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       state: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                       num_k_heads: int, head_k_dim: int, head_v_dim: int) -> str | None:
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
    for name, g in (("a", a), ("b", b)):  # the kernel steps their rows, reads columns densely
        if g.dim() != 2 or tuple(g.shape) != (qkv.size(0), hv) or g.stride(1) != 1:
            return (f"the gate input {name} {tuple(g.shape)} (strides {tuple(g.stride())}) is "
                    f"not [{qkv.size(0)} tokens, {hv} heads] with unit column stride")
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
    problem = gdn_verify_problem(qkv, a, b, state, indices, out, num_k_heads, head_k_dim,
                                 head_v_dim)
    if problem is not None:
        raise ValueError(f"gdn_verify: {problem}")
    launch_gdn_verify(qkv, a, b, A_log, dt_bias, state, indices, num_accepted, cu_seqlens, out,
                      num_k_heads, head_k_dim, head_v_dim)


def launch_gdn_verify(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                      dt_bias: torch.Tensor, state: torch.Tensor, indices: torch.Tensor,
                      num_accepted: torch.Tensor, cu_seqlens: torch.Tensor, out: torch.Tensor,
                      num_k_heads: int, head_k_dim: int, head_v_dim: int, *,
                      block_v: int | None = None, num_warps: int | None = None,
                      prefetch: bool | None = None) -> None:
    """:func:`gdn_verify` without its check, for a caller that has run
    :func:`gdn_verify_problem` on the call already. ``block_v`` (a power of two), ``num_warps``
    and ``prefetch`` override the launch configuration (the benchmark's sweep)."""
    heads = out.size(1)
    sequences = cu_seqlens.numel() - 1
    block_v = min(block_v or BLOCK_V, head_v_dim)
    grid = (head_v_dim // block_v, sequences * heads)
    _gdn_verify_kernel[grid](
        qkv, qkv.stride(0), a, a.stride(0), b, b.stride(0), A_log, dt_bias,
        state, state.stride(0), indices, indices.stride(0), num_accepted, cu_seqlens,
        out, out.stride(0), head_k_dim ** -0.5,
        H=num_k_heads, HV=heads, K=head_k_dim, V=head_v_dim, BV=block_v,
        THRESHOLD=SOFTPLUS_THRESHOLD, PREFETCH=PREFETCH if prefetch is None else prefetch,
        num_warps=num_warps or NUM_WARPS)
