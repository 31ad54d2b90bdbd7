"""The CUDA C++ activation producer (``torch.ops._C_prism.pq2_produce_int8``,
csrc/pq2/producer.cu) on the GPU, which ``VLLM_PRISM_PRODUCER=cuda`` runs instead of the Triton
producer for the int8 kernels.

Every prologue the model feeds a linear (none, the MLP's SiLU-and-multiply, the residual add
with the zero-centred RMSNorm, with and without the normalized input returned, the Gated
DeltaNet output's per-head norm with its SiLU gate, the attention output's sigmoid gate), M =
1, 3 and 6 rows, against an fp64 reference written here (the prologue in torch, then
``gguf.hadamard.forward_transform`` and the per-group quantizer of pq2_reference): codes within
one step (a value on a rounding edge), scales to 1e-5, each group's code sum exact, the
residual sum bit for bit; and against the Triton producer, which makes the same codes but for
such rounding steps.
"""

from __future__ import annotations

import pytest
import torch

from pq2_reference import prologue_reference, quantize_q8, random_signs

from vllm_prism.gguf.hadamard import forward_transform
from vllm_prism.kernels.pq2.hadamard import (ActKind, Prologue, cuda_producer_problem,
                                             transform_activation)

pytestmark = pytest.mark.gpu

K = 5120


def _need_op() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from vllm_prism._custom_ops import has_compiled_op

    if not has_compiled_op("pq2_produce_int8"):
        pytest.skip("vllm_prism._C with pq2_produce_int8 is not built")


def _case(name: str, m: int, gen: torch.Generator, k: int = K,
          group: int = 128) -> tuple[torch.Tensor, Prologue]:
    """(x, prologue) of one prologue kind, bf16 on the GPU (group: the per-head norm's)."""
    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to("cuda", torch.bfloat16)

    w = (torch.rand(k, generator=gen) - 0.5).to("cuda", torch.bfloat16)
    if name == "none":
        return rnd(m, k), Prologue()
    if name == "glu":
        return rnd(m, 2 * k), Prologue(glu=True)
    if name in ("add_rmsnorm", "add_rmsnorm_input"):
        return rnd(m, k), Prologue(residual=rnd(m, k), rms_weight=w, rms_offset=1.0, eps=1e-6,
                                   return_input=name.endswith("input"))
    if name == "gated_head_norm":  # the gate a strided view, as the model's z is
        z = rnd(m, 2 * k)[:, k:]
        wg = (torch.rand(group, generator=gen) + 0.5).to("cuda", torch.float32)
        return rnd(m, k), Prologue(rms_weight=wg, rms_group=group, eps=1e-6, gate=z)
    assert name == "sigmoid_gate"
    return rnd(m, k), Prologue(gate=rnd(m, k), gate_sigmoid=True)


def _cuda(x: torch.Tensor, s: torch.Tensor | None, pro: Prologue, monkeypatch,
          block: int = 1024):
    monkeypatch.setenv("VLLM_PRISM_PRODUCER", "cuda")
    k = x.shape[1] // 2 if pro.glu else x.shape[1]
    assert cuda_producer_problem(x, k, block if s is not None else 1, ActKind.Q8, pro) is None
    return transform_activation(x, s, block if s is not None else None, ActKind.Q8,
                                prologue=pro)


def _check_against_fp64(x: torch.Tensor, s: torch.Tensor, pro: Prologue, act, k: int,
                        block: int) -> None:
    """The producer's Q8 activation against the fp64 reference: codes within one step, scales
    to 1e-5, exact code sums, the residual sum bit for bit, the returned input to bf16."""
    m = x.shape[0]
    v, _ = prologue_reference(x, pro, k)
    want_q, want_scale = quantize_q8(forward_transform(v.cpu(), s.cpu().double(), block))
    got_q = act.data.int().cpu()
    diff = (got_q - want_q).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3, (k, block, diff.max())
    assert torch.allclose(act.group_scale.cpu(), want_scale.float(), rtol=1e-5, atol=0)
    assert torch.equal(act.group_sum.cpu(), got_q.reshape(m, -1, 128).sum(-1).int())
    if pro.residual is not None:
        want_res = (x.float() + pro.residual.float()).to(torch.bfloat16)
        assert torch.equal(act.residual, want_res)
    if pro.return_input:
        assert act.linear_input.dtype == torch.bfloat16
        err = (act.linear_input.double() - v).norm() / v.norm()
        assert err < 2 ** -8, err
    else:
        assert act.linear_input is None


CASES = ["none", "glu", "add_rmsnorm", "add_rmsnorm_input", "gated_head_norm", "sigmoid_gate"]


@pytest.mark.parametrize("m", [1, 3, 6])
@pytest.mark.parametrize("name", CASES)
def test_cuda_producer_matches_the_fp64_reference(name: str, m: int, monkeypatch) -> None:
    _need_op()
    gen = torch.Generator().manual_seed(10 * CASES.index(name) + m)
    x, pro = _case(name, m, gen)
    s = random_signs(K, gen, "cuda")
    _check_against_fp64(x, s, pro, _cuda(x, s, pro, monkeypatch), K, 1024)


# (prologue, K, Hadamard block, per-head norm group): a row's tail tile (K % 1024 != 0),
# whole-row norms over more tiles than the kernel unrolls, blocks whose last stages cross one
# warp pair (512) or none, and per-head norm groups over four lanes and over two warps.
SHAPES = [
    ("add_rmsnorm", 1152, 128, 0),
    ("add_rmsnorm_input", 9344, 128, 0),
    ("add_rmsnorm", 6144, 512, 0),
    ("glu", 17408, 1024, 0),
    ("none", 3200, 128, 0),
    ("gated_head_norm", 4096, 256, 32),
    ("gated_head_norm", 6144, 1024, 512),
]


@pytest.mark.parametrize("name,k,block,group", SHAPES)
def test_cuda_producer_shapes_match_the_fp64_reference(name: str, k: int, block: int,
                                                       group: int, monkeypatch) -> None:
    _need_op()
    gen = torch.Generator().manual_seed(k + block + group)
    x, pro = _case(name, 3, gen, k, group or 128)
    s = random_signs(k, gen, "cuda")
    _check_against_fp64(x, s, pro, _cuda(x, s, pro, monkeypatch, block), k, block)


@pytest.mark.parametrize("name", CASES)
def test_cuda_producer_matches_the_triton_producer(name: str, monkeypatch) -> None:
    """The same int8 activation as the Triton producer but for rare rounding steps; without
    signs (a plain per-group quantizer) too."""
    _need_op()
    gen = torch.Generator().manual_seed(7)
    x, pro = _case(name, 6, gen)
    for s in (random_signs(K, gen, "cuda"), None):
        block = 1024 if s is not None else None
        monkeypatch.setenv("VLLM_PRISM_PRODUCER", "triton")
        tri = transform_activation(x, s, block, ActKind.Q8, prologue=pro)
        cud = _cuda(x, s, pro, monkeypatch)
        diff = (tri.data.int() - cud.data.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3, (name, diff.max())
        assert torch.allclose(tri.group_scale, cud.group_scale, rtol=1e-5, atol=0)
        if pro.residual is not None:
            assert torch.equal(tri.residual, cud.residual)


def test_cuda_producer_refusals_name_the_problem() -> None:
    _need_op()
    x = torch.zeros(1, K, device="cuda", dtype=torch.bfloat16)
    assert "FLOAT" in cuda_producer_problem(x, K, 1024, ActKind.FLOAT, Prologue())
    assert "float32" in cuda_producer_problem(x.float(), K, 1024, ActKind.Q8, Prologue())
    res = torch.zeros(1, K, device="cuda", dtype=torch.float32)
    assert "residual" in cuda_producer_problem(x, K, 1024, ActKind.Q8, Prologue(residual=res))
    assert "2048" in cuda_producer_problem(x, K, 2048, ActKind.Q8, Prologue())
