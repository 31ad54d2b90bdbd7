"""The L2 prefetch of the next linear's weights: the registry's order (CPU), and on the GPU
the CUDA C++ GEMV's result unchanged by the prefetch it issues (a hint: outputs bit for bit
equal to the GEMV without it)."""

from __future__ import annotations

import gc

import pytest
import torch

from vllm_prism.kernels.pq2 import prefetch


@pytest.fixture(autouse=True)
def _fresh_chain():
    prefetch.clear_chain()
    yield
    prefetch.clear_chain()


def _planes(n: int, k: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.zeros(n, k // 16, dtype=torch.int32, device=device),
            torch.zeros(n, k // 128, dtype=torch.float16, device=device))


def test_each_layer_prefetches_the_next_registered_one(monkeypatch) -> None:
    monkeypatch.setattr(prefetch, "PREFETCH_MAX_BYTES", 64 * 1280)  # 64 rows of K = 5120
    layers = [_planes(96, 5120), _planes(32, 5120), _planes(200, 5120)]
    for codes, scales in layers:
        prefetch._link(codes, scales)
    nxt = prefetch.next_planes(layers[0][0])
    assert nxt[0].data_ptr() == layers[1][0].data_ptr() and nxt[0].shape == (32, 320)
    nxt = prefetch.next_planes(layers[1][0])  # capped at 64 of its 200 rows
    assert nxt[0].shape == (64, 320) and nxt[1].shape == (64, 40) and nxt[0].is_contiguous()
    assert prefetch.next_planes(layers[2][0]) is None  # the last layer


def test_a_freed_layer_is_not_kept_alive_nor_prefetched() -> None:
    first, second = _planes(8, 256), _planes(8, 256)
    prefetch._link(*first)
    prefetch._link(*second)
    del second
    gc.collect()
    assert prefetch.next_planes(first[0]) is None


def test_cpu_planes_are_not_linked_and_bad_modes_are_refused(monkeypatch) -> None:
    a, b = _planes(8, 256), _planes(8, 256)
    prefetch.register_planes(*a)
    prefetch.register_planes(*b)
    assert prefetch.next_planes(a[0]) is None
    monkeypatch.setenv("VLLM_PRISM_L2_PREFETCH", "3")
    with pytest.raises(ValueError, match="VLLM_PRISM_L2_PREFETCH"):
        prefetch.l2_prefetch_mode()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("kernel", ["gemv", "mma_small:0", "mma_small:2"])
def test_kernels_with_prefetch_equal_kernels_without(kernel: str, mode: int) -> None:
    """The CUDA C++ GEMV (M = 1) and the small-batch kernel (M = 4; variant 0 stages the codes
    in shared memory, 2 streams them into registers) give the same bits with the next
    linear's planes asked into L2 as without."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from vllm_prism._custom_ops import has_compiled_op

    if not has_compiled_op("pq2_gemv_int8"):
        pytest.skip("vllm_prism._C is not built")
    g = torch.Generator(device="cuda").manual_seed(mode)
    n, k = 12288, 5120
    m = 1 if kernel == "gemv" else 4
    codes = torch.randint(-2**31, 2**31 - 1, (n, k // 16), dtype=torch.int32, device="cuda",
                          generator=g)
    scales = (torch.rand(n, k // 128, device="cuda", generator=g) * 0.01).half()
    nxt_codes, nxt_scales = codes[:4096].clone(), scales[:4096].clone()
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda", generator=g)
    sx = torch.rand(m, k // 128, device="cuda", generator=g)
    if kernel == "gemv":
        def run(*pf):
            return torch.ops._C_prism.pq2_gemv_int8(codes, scales, xq, sx, None, torch.bfloat16,
                                                    False, *pf)
    else:
        qsum = xq.view(m, k // 128, 128).sum(-1, dtype=torch.int32)
        variant = int(kernel.split(":")[1])

        def run(*pf):
            return torch.ops._C_prism.pq2_mma_small_int8(codes, scales, xq, sx, qsum, None,
                                                         torch.bfloat16, False, variant, *pf)
    plain = run()
    with_pf = run(nxt_codes, nxt_scales, mode)
    torch.cuda.synchronize()
    assert torch.equal(plain, with_pf)
