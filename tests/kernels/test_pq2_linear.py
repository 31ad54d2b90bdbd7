"""PQ2 linear kernels on the GPU against the torch reference (codecs_torch + gguf.hadamard).

Tolerances (relative Frobenius error against an fp64 reference with the exact transform):

* ``gemv_a16``: fp32 activation and fp32 math; only the bf16 output rounds: 4e-3.
* ``mma_a16`` / ``gemm_a16``: the activation is rounded to bf16 once after the transform, as
  the reference ``forward_transform`` returns it; fp32 accumulation; bf16 output: 8e-3.
* int8-activation kernels (``gemv_a8``, ``mma_a8``, ``gemm_a8``): 3e-2 against the float
  reference (activation quantization error), and, with fp32 output, 2e-5 against the exact
  integer reference built from the kernel's own int8 activation: the integer sums are exact,
  only the fp32 epilogue rounds.
* ``ptq1_gemv``: fp32 activation and math: 4e-3 (bf16 output).
"""

from __future__ import annotations

import pytest
import torch

from pq2_reference import (dense, integer_reference, random_signs, random_ternary,
                           reference_linear, rel_err)

from vllm_prism.kernels.pq2 import dispatch
from vllm_prism.kernels.pq2.hadamard import hadamard_transform
from vllm_prism.kernels.pq2.layout import PQ2Weight, PTQ1Weight

pytestmark = pytest.mark.gpu

BONSAI_SHAPES = [(1024, 5120), (12288, 5120), (10240, 5120), (6144, 5120), (14336, 5120),
                 (34816, 5120), (5120, 6144), (5120, 17408), (248320, 5120)]
ODD_SHAPES = [(37, 640, 128), (300, 2304, 256), (4097, 5120, 1024), (96, 384, None)]
M_FULL = list(range(1, 17)) + [24, 32, 48, 64, 128, 512, 2048]
TOL = {"gemv_a16": 4e-3, "mma_a16": 8e-3, "gemm_a16": 8e-3, "gemv_a8": 3e-2, "mma_a8": 3e-2,
       "gemm_a8": 3e-2, "ptq1_gemv": 4e-3, "mma_cuda": 3e-2, "gemv_cuda": 3e-2, "gemm_dq": 1e-2,
       "mma_small_cuda": 3e-2, "mma_small_pipe_cuda": 3e-2, "mma_stream_cuda": 3e-2,
       "mma_bulk_cuda": 3e-2, "mma_persist_cuda": 3e-2, "mma_lean_cuda": 3e-2}
A8 = {"gemv_a8", "mma_a8", "gemm_a8", "mma_cuda", "gemv_cuda", "mma_small_cuda",
      "mma_small_pipe_cuda", "mma_stream_cuda", "mma_bulk_cuda", "mma_persist_cuda",
      "mma_lean_cuda"}


def kernels_for(m: int, n: int = 0) -> list[str]:
    from vllm_prism.kernels.pq2.triton_gemv import gemv_max_m

    if m == 1:
        return ["gemv_a8", "gemv_a16"]
    if m <= dispatch.MMA_MAX_M:
        return (["gemv_a8"] if m <= gemv_max_m(n) else []) + ["mma_a16", "mma_a8"]
    return ["gemm_a16", "gemm_a8"] + (["gemm_dq"] if m >= dispatch.GEMM_DQ_MIN_M else [])


_CACHE: dict[tuple, tuple] = {}


def make_case(n: int, k: int, block: int | None, fmt: str = "PQ2_0"):
    key = (n, k, block, fmt)
    if key not in _CACHE:
        _CACHE.clear()  # keep one big matrix at a time
        gen = torch.Generator().manual_seed(n * 7 + k)
        raw, q, d = random_ternary(n, k, fmt, gen, "cuda")
        signs = random_signs(k, gen, "cuda") if block else None
        cls = PQ2Weight if fmt == "PQ2_0" else PTQ1Weight
        w = cls.from_raw(raw, signs, block)
        _DENSE.clear()
        _DENSE[key] = dense(raw, fmt)
        _CACHE[key] = (raw, q, d, signs, w)
    return _CACHE[key]


_DENSE: dict[tuple, torch.Tensor] = {}


def _dense_of(w) -> torch.Tensor | None:
    for (n, k, _, fmt), t in _DENSE.items():
        if (n, k, fmt) == (w.n, w.k, w.fmt):
            return t
    return None


def check_kernel(name: str, x: torch.Tensor, raw, q, d, signs, block, w, bias=None) -> None:
    kernel = dispatch._BY_NAME[name]
    fmt = w.fmt
    ok, why = kernel.can_implement(dispatch.PQ2LinearConfig.of(x.shape[0], w, x.dtype))
    assert ok, why
    act = kernel.make_activation(x, w)
    y = kernel.run(act, w, bias, x.dtype)
    assert y.shape == (x.shape[0], w.n) and y.dtype == x.dtype
    assert torch.isfinite(y).all()
    ref = reference_linear(x, raw, fmt, signs, block, bias, w_dense=_dense_of(w))
    err = rel_err(y, ref)
    assert err < TOL[name], f"{name}: relative error {err:.2e} >= {TOL[name]}"
    if name in A8 and x.shape[0] <= 128:
        y32 = kernel.run(act, w, bias, torch.float32)
        xq = act.data
        iref = integer_reference(xq.int(), act.group_scale, q, d, bias)
        ierr = rel_err(y32, iref)
        assert ierr < 2e-5, f"{name}: integer path error {ierr:.2e}"
        assert torch.equal(act.group_sum, xq.int().reshape(x.shape[0], -1, 128).sum(-1))


@pytest.mark.parametrize("shape", BONSAI_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_bonsai_shapes(shape: tuple[int, int]) -> None:
    n, k = shape
    raw, q, d, signs, w = make_case(n, k, 1024)
    ms = [1, 7, 128] if n > 100000 else [1, 5, 16, 64, 128]
    gen = torch.Generator(device="cuda").manual_seed(n)
    for m in ms:
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        for name in kernels_for(m, n):
            check_kernel(name, x, raw, q, d, signs, 1024, w)


@pytest.mark.parametrize("m", M_FULL)
def test_all_m_fused_qkv(m: int) -> None:
    """Every M of the issue on one model shape (fused attention qkv), auto dispatch too."""
    raw, q, d, signs, w = make_case(6144, 5120, 1024)
    x = torch.randn(m, 5120, device="cuda", generator=torch.Generator(device="cuda").manual_seed(m))
    x = x.to(torch.bfloat16)
    for name in kernels_for(m, 6144):
        check_kernel(name, x, raw, q, d, signs, 1024, w)
    y = dispatch.pq2_linear(x, w)
    assert rel_err(y, reference_linear(x, raw, "PQ2_0", signs, 1024)) < 3e-2


@pytest.mark.parametrize("case", ODD_SHAPES, ids=lambda c: f"{c[0]}x{c[1]}-b{c[2]}")
@pytest.mark.parametrize("m", [1, 3, 17, 130])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_odd_shapes_bias_dtypes(case, m: int, dtype: torch.dtype) -> None:
    n, k, block = case
    raw, q, d, signs, w = make_case(n, k, block)
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    bias = torch.randn(n, device="cuda", generator=gen).to(dtype)
    for name in kernels_for(m, n):
        check_kernel(name, x, raw, q, d, signs, block, w, bias)


@pytest.mark.parametrize("shape", [(5120, 6144), (248320, 5120), (300, 2304)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_ptq1(shape: tuple[int, int]) -> None:
    n, k = shape
    block = 256 if k == 2304 else 1024
    raw, q, d, signs, w = make_case(n, k, block, "PTQ1_0")
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
    check_kernel("ptq1_gemv", x, raw, q, d, signs, block, w)
    if n < 100000:  # M > 1 runs through the lossless PQ2 copy
        x = torch.randn(9, k, device="cuda", generator=gen).to(torch.bfloat16)
        y = dispatch.pq2_linear(x, w)
        assert rel_err(y, reference_linear(x, raw, "PTQ1_0", signs, block)) < 8e-3


def test_split_k_and_code_three() -> None:
    """All-(+2) weights (code 3) through every path, and a split-K launch."""
    from vllm_prism.kernels.pq2.triton_mma import TCConfig, pq2_tc_linear

    n, k = 256, 2048
    raw = torch.full((n, k // 128 * 34), 0xFF, dtype=torch.uint8)
    d = torch.full((n, k // 128), 0.25, dtype=torch.float16)
    raw.view(n, k // 128, 34)[:, :, :2] = d.view(torch.uint8).reshape(n, k // 128, 2)
    w = PQ2Weight.from_raw(raw.cuda())
    x = torch.randn(4, k, device="cuda").to(torch.bfloat16)
    expect = 0.5 * x.double().sum(dim=1, keepdim=True).expand(4, n)
    for m, names in ((1, ["gemv_a8", "gemv_a16"]), (4, ["mma_a16", "gemm_a16"])):
        for name in names:
            kern = dispatch._BY_NAME[name]
            act = kern.make_activation(x[:m], w)
            want = expect[:m]
            if name.endswith("a8"):  # against the int8 activation it consumed
                xq = act.data.double() * act.group_scale.double().repeat_interleave(128, 1)
                want = 0.5 * xq.sum(dim=1, keepdim=True).expand(m, n)
            y = kern.run(act, w, None, torch.float32)
            assert rel_err(y, want) < 1e-5, name
    act = dispatch._BY_NAME["mma_a16"].make_activation(x, w)
    y = pq2_tc_linear(act, w, None, torch.float32, TCConfig(block_n=32, block_m=16, split_k=4))
    assert rel_err(y, expect) < 1e-5


@pytest.mark.parametrize("k,block", [(5120, 1024), (6144, 1024), (17408, 1024), (512, 64)])
@pytest.mark.parametrize("m", [1, 33])
def test_hadamard_standalone(k: int, block: int, m: int) -> None:
    from vllm_prism.gguf.hadamard import forward_transform

    gen = torch.Generator(device="cuda").manual_seed(k + m)
    x = torch.randn(m, k, device="cuda", generator=gen)
    s = random_signs(k, torch.Generator().manual_seed(k)).cuda()
    torch.testing.assert_close(hadamard_transform(x, s, block), forward_transform(x, s, block),
                               rtol=0, atol=0)  # fp32: same butterfly, same order
    xb = x.to(torch.bfloat16)
    torch.testing.assert_close(hadamard_transform(xb, s, block).float(),
                               forward_transform(xb, s, block).float(), rtol=0, atol=0)


def _need_mma_cuda(name: str = "mma_cuda") -> None:
    ok, why = dispatch._BY_NAME[name].is_supported(torch.cuda.get_device_capability())
    if not ok:
        pytest.skip(f"{name}: {why}")


@pytest.mark.parametrize("shape", BONSAI_SHAPES + [(300, 2304), (8, 49152)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_gemv_cuda(shape: tuple[int, int]) -> None:
    """The CUDA GEMV (csrc/pq2/gemv_int8.cu) at M = 1 on every Bonsai shape: each layout the
    launch chooses (8 lanes a row and two passes at K = 5120 on >= 4096 rows, 16 lanes below;
    16 lanes x 3 chunks with prefetch at K = 6144; 16 x 6 in three passes at K = 17408, eight
    at 49152 with more than 48 KiB of shared memory), rows past N (300 rows)."""
    _need_mma_cuda("gemv_cuda")
    n, k = shape
    raw, q, d, signs, w = make_case(n, k, 128)
    x = torch.randn(1, k, device="cuda", generator=torch.Generator("cuda").manual_seed(n))
    check_kernel("gemv_cuda", x.bfloat16(), raw, q, d, signs, 128, w)


@pytest.mark.parametrize("m", [2, 3, 4])
@pytest.mark.parametrize("shape", [(12288, 5120), (1024, 5120), (5120, 6144), (5120, 17408),
                                   (300, 2304), (8, 16384)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_gemv_cuda_several_rows(shape: tuple[int, int], m: int) -> None:
    """The CUDA GEMV with 2..4 activation rows (one chunk of codes in registers serves every
    row): each layout, rows past N; against the exact and the integer reference."""
    _need_mma_cuda("gemv_cuda")
    n, k = shape
    raw, q, d, signs, w = make_case(n, k, 128)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(n + m))
    check_kernel("gemv_cuda", x.bfloat16(), raw, q, d, signs, 128, w)


@pytest.mark.parametrize("name,n,k,m", [("gemv_cuda", 1000, 17408, 1),
                                         ("mma_small_cuda", 1000, 6144, 6),
                                         ("mma_stream_cuda", 1000, 6144, 11),
                                         ("mma_bulk_cuda", 1000, 6144, 11),
                                         ("mma_persist_cuda", 1000, 17408, 6),
                                         ("mma_lean_cuda", 1000, 6144, 6)])
def test_cuda_kernel_bias_fp16(name: str, n: int, k: int, m: int) -> None:
    """fp16 activations, outputs and bias through the CUDA C++ kernels that take them."""
    _need_mma_cuda(name)
    gen = torch.Generator().manual_seed(12)
    raw, q, d = random_ternary(n, k, "PQ2_0", gen, "cuda")
    w = PQ2Weight.from_raw(raw)
    x = torch.randn(m, k, generator=gen).to("cuda", torch.float16)
    bias = torch.randn(n, generator=gen).to("cuda", torch.float16)
    check_kernel(name, x, raw, q, d, None, None, w, bias=bias)


@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16])
@pytest.mark.parametrize("shape", [(12288, 5120), (5120, 6144), (5120, 17408), (300, 2304),
                                   (17000, 1024)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_mma_small_cuda(shape: tuple[int, int], m: int) -> None:
    """The small-batch CUDA kernel (csrc/pq2/mma_small.cu): one and two token tiles (M <= 8,
    <= 16); CTAs of 64, 32, 16, 16 and 128 rows (the shapes in that order: K and N choose it);
    rows past N (300 and 17000 rows); against the exact and the integer reference."""
    _need_mma_cuda("mma_small_cuda")
    n, k = shape
    raw, q, d, signs, w = make_case(n, k, 128)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(n + m))
    check_kernel("mma_small_cuda", x.bfloat16(), raw, q, d, signs, 128, w)


@pytest.mark.parametrize("m", [1, 2, 8, 9, 16])
@pytest.mark.parametrize("shape", [(12288, 5120), (5120, 17408), (300, 2304), (17000, 1024),
                                   (64, 768)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_mma_small_pipe_cuda(shape: tuple[int, int], m: int) -> None:
    """The pipelined variant of the small-batch kernel (op variant 1): against the exact and
    the integer reference, and bit for bit equal to variant 0 (same sums in the same order);
    K = 17408 gives each warp 17 groups (more than the 15 a wait can name), K = 768 some
    warps none."""
    pipe, base, act, w = _small_variant_case("mma_small_pipe_cuda", shape, m)
    assert torch.equal(pipe.run(act, w, None, torch.float32),
                       base.run(act, w, None, torch.float32))


def _small_variant_case(name: str, shape: tuple[int, int], m: int):
    """A variant of the small-batch op checked against both references on ``shape`` with
    ``m`` rows; (its kernel class, mma_small_cuda's, the int8 activation, the weight) for
    the comparison with variant 0."""
    _need_mma_cuda(name)
    n, k = shape
    raw, q, d, signs, w = make_case(n, k, 128)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(n + m))
    check_kernel(name, x.bfloat16(), raw, q, d, signs, 128, w)
    kern = dispatch._BY_NAME[name]
    return kern, dispatch._BY_NAME["mma_small_cuda"], kern.make_activation(x.bfloat16(), w), w


@pytest.mark.parametrize("m", [1, 2, 4, 8, 9, 16])
@pytest.mark.parametrize("shape", [(12288, 5120), (34816, 5120), (5120, 6144), (5120, 17408),
                                   (300, 2304), (17000, 1024), (40, 128), (24, 1280)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_mma_stream_cuda(shape: tuple[int, int], m: int) -> None:
    """The streaming small-batch kernel (op variant 2): against the exact and the integer
    reference. The shapes give K slices of 10 groups a warp with two row tiles a CTA
    (K = 5120), 6 groups (K = 6144), 8-9 groups over 16 warps (K = 17408), four row tiles a
    CTA with the last CTA's fourth tile wholly past N (17000x1024), 10 groups in one slice
    (K = 1280), one group (K = 128), rows past N in a tile (300, 17000, 40, 24 rows); one and
    two token tiles. Its sums are the same int32 group sums as mma_small_cuda's, added in
    another order: equal to within fp32 rounding; so are those of op variant 3 (K slices of
    at most 5 groups: other slice counts)."""
    stream, base, act, w = _small_variant_case("mma_stream_cuda", shape, m)
    short = stream.with_variant(3)  # op variant 3: <= 5 groups
    y, y0, y3 = (kern.run(act, w, None, torch.float32) for kern in (stream, base, short))
    assert rel_err(y, y0) < 1e-6 and rel_err(y3, y0) < 1e-6


@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("shape", [(12288, 5120), (34816, 5120), (5120, 6144), (5120, 17408),
                                   (1024, 5120), (300, 2304), (17000, 1024), (40, 128),
                                   (24, 1280), (8, 640)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_mma_bulk_cuda(shape: tuple[int, int], m: int) -> None:
    """The small-batch kernel with each multiprocessor's equal share of the matrix (op
    variant 4): against the exact and the integer reference, and twice in a row bit for bit
    (the tile counters are left at zero, a shared tile's partials added in CTA order). The
    shapes give CTAs of several tiles with partial first and last tiles (12288, 34816 rows),
    one stage a tile (K = 5120, 6144) and three (K = 17408), a tile shared by three CTAs
    (1024x5120: 19 units a CTA), fewer groups than warps in a stage (K = 1280, 2304), a
    4-byte scale pair past an odd group count (K = 640), one group a row (K = 128), fewer
    CTAs than multiprocessors (40x128, 8x640) and rows past N (300, 17000, 40, 24, 8 rows);
    one and two token tiles."""
    bulk, base, act, w = _small_variant_case("mma_bulk_cuda", shape, m)
    y, y0 = (kern.run(act, w, None, torch.float32) for kern in (bulk, base))
    assert rel_err(y, y0) < 1e-6
    assert torch.equal(bulk.run(act, w, None, torch.float32), y)


@pytest.mark.parametrize("m", [1, 2, 6, 8, 9, 16])
@pytest.mark.parametrize("shape", [(12288, 5120), (34816, 5120), (5120, 6144), (5120, 17408),
                                   (300, 2304), (17000, 1024), (40, 128), (24, 1280)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_mma_persist_cuda(shape: tuple[int, int], m: int) -> None:
    """The streaming kernel's warps in resident CTAs (op variant 5): against the exact and the
    integer reference, equal to mma_small_cuda's sums to within fp32 rounding, and twice in a
    row bit for bit. The shapes give CTAs that walk several units (every shape with more row
    tiles than resident CTAs: 34816x5120 about eight), two passes a unit (K = 17408: 9 groups
    a slice of 16 warps), one pass of 3-5 groups (K = 5120, 6144), fewer CTAs than
    multiprocessors (40x128, 24x1280), a last unit past N (17000x1024, 300, 40, 24 rows);
    one and two token tiles."""
    kern, base, act, w = _small_variant_case("mma_persist_cuda", shape, m)
    y, y0 = (k.run(act, w, None, torch.float32) for k in (kern, base))
    assert rel_err(y, y0) < 1e-6
    assert torch.equal(kern.run(act, w, None, torch.float32), y)


@pytest.mark.parametrize("m", [1, 2, 6, 8])
@pytest.mark.parametrize("shape", [(12288, 5120), (34816, 5120), (5120, 6144), (5120, 17408),
                                   (300, 2560), (17000, 1024), (40, 512), (24, 9216)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_mma_lean_cuda(shape: tuple[int, int], m: int) -> None:
    """The short-pass small-batch kernel (op variant 6): against the exact and the integer
    reference, equal to mma_small_cuda's sums to within fp32 rounding, and twice in a row bit
    for bit. The default geometry (pq2_mma_lean_default_config) gives these shapes one to ten
    units of four groups a warp, the next one prefetched, one or two row tiles a CTA and 96 or
    128 registers (the sweep, benchmarks/kernels/pq2_small_sweep.cu, checks every other
    geometry against its host reference); rows past N (300, 17000, 40, 24 rows); M = 1..8 in
    one token tile."""
    kern, base, act, w = _small_variant_case("mma_lean_cuda", shape, m)
    y, y0 = (k.run(act, w, None, torch.float32) for k in (kern, base))
    assert rel_err(y, y0) < 1e-6
    assert torch.equal(kern.run(act, w, None, torch.float32), y)


@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 48, 64, 65, 128, 300])
def test_mma_cuda_every_m(m: int) -> None:
    """The CUDA int8 tensor-core kernel (csrc/pq2/mma_int8.cu) at every m-tile count, with
    rows past M in a tile, and over several 64-row tiles; against the float reference and
    the exact integer reference."""
    _need_mma_cuda()
    raw, q, d, signs, w = make_case(12288, 5120, 1024)
    x = torch.randn(m, 5120, device="cuda", generator=torch.Generator("cuda").manual_seed(m))
    check_kernel("mma_cuda", x.bfloat16(), raw, q, d, signs, 1024, w)


@pytest.mark.parametrize("shape", [(5120, 6144), (5120, 17408), (1024, 5120), (248320, 5120)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 6, 64, 512])
def test_mma_cuda_bonsai_shapes(shape: tuple[int, int], m: int) -> None:
    """Narrow outputs take a K split (partials reduced by each tile's last CTA), the LM head
    does not."""
    _need_mma_cuda()
    n, k = shape
    raw, q, d, signs, w = make_case(n, k, 1024)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(n + m))
    check_kernel("mma_cuda", x.bfloat16(), raw, q, d, signs, 1024, w)


@pytest.mark.parametrize("split", [1, 3])
def test_mma_cuda_odd_rows_bias_fp16_and_split(split: int) -> None:
    """N not a multiple of the 128-row tile, a bias, fp16 activations; a forced K split."""
    _need_mma_cuda()
    n, k, m = 300, 2304, 5
    gen = torch.Generator().manual_seed(11)
    raw, q, d = random_ternary(n, k, "PQ2_0", gen, "cuda")
    signs = random_signs(k, gen, "cuda")
    w = PQ2Weight.from_raw(raw, signs, 256)
    x = torch.randn(m, k, generator=gen).to("cuda", torch.float16)
    bias = torch.randn(n, generator=gen).to("cuda", torch.float16)
    kern = dispatch._BY_NAME["mma_cuda"]
    act = kern.make_activation(x, w)
    y = torch.ops._C_prism.pq2_mma_int8(w.codes, w.scales, act.data, act.group_scale,
                                        act.group_sum, bias, torch.float32, split, False)
    iref = integer_reference(act.data.int(), act.group_scale, q, d, bias)
    assert rel_err(y, iref) < 2e-5
    y16 = kern.run(act, w, bias, torch.float16)
    assert y16.dtype == torch.float16
    assert rel_err(y16, reference_linear(x, raw, "PQ2_0", signs, 256, bias)) < 3e-2


def test_mma_cuda_split_counters_reset_across_launches_and_graph_replays() -> None:
    """A K split's tile counters are left at zero by every launch: back-to-back launches, two
    m-tiles (grid z) and CUDA-graph replays all give the first launch's result bit for bit."""
    _need_mma_cuda()
    n, k, m = 640, 5120, 70
    gen = torch.Generator().manual_seed(21)
    raw, q, d = random_ternary(n, k, "PQ2_0", gen, "cuda")
    w = PQ2Weight.from_raw(raw)
    x = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
    act = dispatch._BY_NAME["mma_cuda"].make_activation(x, w)

    def run() -> torch.Tensor:
        return torch.ops._C_prism.pq2_mma_int8(w.codes, w.scales, act.data, act.group_scale,
                                               act.group_sum, None, torch.float32, 4, False)

    first = run()
    assert rel_err(first, integer_reference(act.data.int(), act.group_scale, q, d)) < 2e-5
    for _ in range(4):
        assert torch.equal(run(), first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for _ in range(4):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)


@pytest.mark.parametrize("shape", [(5120, 17408), (5120, 6144), (1024, 5120)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("split,depth", [(2, 1), (4, 2), (3, 3)])
def test_gemv_a8_split_k_exact_and_replayable(shape: tuple[int, int], split: int,
                                              depth: int) -> None:
    """The K-split int8 GEMV (a sweep variant): exact against the integer reference, and a
    CUDA graph of it replays to the same bits (each tile's last program resets its counter;
    a stale counter would skip or double a tile's sum)."""
    from vllm_prism.kernels.pq2.triton_gemv import GemvConfig, _split_counters, gemv_a8

    n, k = shape
    raw, q, d, signs, w = make_case(n, k, 1024)
    x = torch.randn(1, k, device="cuda", generator=torch.Generator("cuda").manual_seed(split))
    act = dispatch._BY_NAME["gemv_a8"].make_activation(x.bfloat16(), w)
    cfg = GemvConfig(16, 8, 4, depth=depth, prefetch_scales=depth > 1, split_k=split)
    y = gemv_a8(act, w, None, torch.float32, cfg)
    iref = integer_reference(act.data.int(), act.group_scale, q, d)
    assert rel_err(y, iref) < 2e-5
    assert not _split_counters(w.device).any()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv_a8(act, w, None, torch.float32, cfg)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y)
