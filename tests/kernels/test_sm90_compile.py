"""The activation producer compiles for Hopper (sm_90) without a GPU: Triton's NVIDIA backend
and ptxas run on the CPU, so a prologue variant that only the GPU compiler rejects (a reshape,
a reduction over a per-head group) fails here in CI, not on the device. Every prologue the
model uses (glu, residual add + norm, the same returning the normalized input, per-head gated
norm, sigmoid gate) x every layout, each
with programmatic dependent launch (how Hopper runs them), and the weight kernels with it: the
grid-dependency instructions must be in the PTX, with the GEMV's first weight load issued
before its wait."""

from __future__ import annotations

import math

import pytest

triton = pytest.importorskip("triton")

from vllm_prism.kernels.pq2 import (hadamard, triton_dequant, triton_gemv,  # noqa: E402
                                    triton_mma)

PROLOGUES = {
    "glu": dict(GLU=1, HAS_RES=0, HAS_RMS=0, RMS_GROUP=0, HAS_GATE=0, GATE_SIGMOID=0),
    "add_rmsnorm": dict(GLU=0, HAS_RES=1, HAS_RMS=1, RMS_GROUP=0, HAS_GATE=0, GATE_SIGMOID=0),
    "add_rmsnorm_input": dict(GLU=0, HAS_RES=1, HAS_RMS=1, RMS_GROUP=0, HAS_GATE=0,
                              GATE_SIGMOID=0, HAS_XOUT=1),
    "gated_head_norm": dict(GLU=0, HAS_RES=0, HAS_RMS=1, RMS_GROUP=128, HAS_GATE=1,
                            GATE_SIGMOID=0),
    "sigmoid_gate": dict(GLU=0, HAS_RES=0, HAS_RMS=0, RMS_GROUP=0, HAS_GATE=1, GATE_SIGMOID=1),
}
OUT = {0: ("*bf16", "*fp32"), 1: ("*fp32", "*fp32"), 2: ("*i8", "*i32")}  # out, group sums


def _target():
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        pytest.skip("this Triton has no ahead-of-time compile API")
    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this Triton has no NVIDIA backend")
    return ASTSource, GPUTarget("cuda", 90, 32)


@pytest.mark.parametrize("mode", sorted(OUT))
@pytest.mark.parametrize("prologue", sorted(PROLOGUES))
def test_producer_compiles_for_sm90(prologue: str, mode: int) -> None:
    ast_source, target = _target()
    consts = dict(SEG=1024, LOG_B=7, INV_SQRT_B=1 / math.sqrt(128), HAS_SIGNS=1,
                  RMS_BLOCK=1024, RMS_STEPS=5, HAS_XOUT=0, MODE=mode, PDL=1)
    consts.update(PROLOGUES[prologue])
    out, gsum = OUT[mode]
    sig = {"x_ptr": "*bf16", "res_ptr": "*bf16", "resout_ptr": "*bf16", "signs_ptr": "*fp32",
           "rmsw_ptr": "*bf16", "gate_ptr": "*bf16", "xout_ptr": "*bf16", "out_ptr": out,
           "gscale_ptr": "*fp32",
           "gsum_ptr": gsum,
           **{k: "i32" for k in ("K", "stride_xm", "stride_rm", "stride_zm", "stride_om",
                                 "stride_gm")},
           "eps": "fp32", "rms_offset": "fp32", **{k: "constexpr" for k in consts}}
    kernel = triton.compile(ast_source(hadamard._act_kernel, sig, constexprs=consts),
                            target=target, options={"num_warps": 4})
    assert kernel.asm.get("cubin"), "no cubin produced"
    ptx = kernel.asm["ptx"]
    assert "griddepcontrol.launch_dependents" in ptx and "griddepcontrol.wait" in ptx
    # the model's constants (the fold's signs, the norm's weight) are loaded before the wait,
    # while the kernel before this one finishes; the activation after it
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") < wait
    before, after = ptx[:wait].count("ld.global"), ptx[wait:].count("ld.global")
    assert before >= 1 + PROLOGUES[prologue]["HAS_RMS"] and after >= 1, (before, after)


def _ptx(fn, sig: dict, consts: dict, **options: int) -> str:
    ast_source, target = _target()
    sig = {**sig, **{k: "constexpr" for k in consts}}
    kernel = triton.compile(ast_source(fn, sig, constexprs=consts), target=target,
                            options={"num_warps": 4, **options})
    assert kernel.asm.get("cubin"), "no cubin produced"
    return kernel.asm["ptx"]


@pytest.mark.parametrize("pdl", [0, 1])
def test_gemv_a8_compiles_with_pdl(pdl: int) -> None:
    sig = {"codes_ptr": "*i32", "scales_ptr": "*fp16", "xq_ptr": "*i32", "sx_ptr": "*fp32",
           "qsum_ptr": "*i32", "bias_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32",
           "cnt_ptr": "*i32",
           **{k: "i32" for k in ("M", "N", "G", "G_PER", "stride_cn", "stride_sn", "stride_xm",
                                 "stride_gm", "stride_om")}}
    consts = dict(BLOCK_N=32, BLOCK_G=8, BLOCK_M=1, USE_ASM=1, HAS_BIAS=0, EVEN_G=1, PDL=pdl,
                  DEPTH=1, SCALES_AHEAD=0, SPLIT=1)
    ptx = _ptx(triton_gemv._gemv_a8_kernel, sig, consts)
    if not pdl:
        assert "griddepcontrol" not in ptx
        return
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") < wait
    # the first weight tile's load is issued before the wait (so it overlaps the producer)
    assert "ld.global" in ptx[:wait]


def _gemv_loads_before_wait(depth: int, scales_ahead: int, split: int = 1) -> int:
    sig = {"codes_ptr": "*i32", "scales_ptr": "*fp16", "xq_ptr": "*i32", "sx_ptr": "*fp32",
           "qsum_ptr": "*i32", "bias_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32",
           "cnt_ptr": "*i32",
           **{k: "i32" for k in ("M", "N", "G", "G_PER", "stride_cn", "stride_sn", "stride_xm",
                                 "stride_gm", "stride_om")}}
    consts = dict(BLOCK_N=32, BLOCK_G=8, BLOCK_M=1, USE_ASM=1, HAS_BIAS=0, EVEN_G=1, PDL=1,
                  DEPTH=depth, SCALES_AHEAD=scales_ahead, SPLIT=split)
    ptx = _ptx(triton_gemv._gemv_a8_kernel, sig, consts)
    if split > 1:  # the tile count is an acquire-release atomic, after a CTA barrier
        assert "atom.global.acq_rel" in ptx.replace(".gpu", "") and "bar.sync" in ptx
    return ptx[:ptx.index("griddepcontrol.wait")].count("ld.global")


def test_gemv_a8_prefetch_variants_compile() -> None:
    """The GEMV with more weight tiles in flight (and their scales with them) lowers for
    sm_90 with PDL, and every tile loaded ahead of the loop is issued before the wait:
    depth d issues d times the code loads of depth 1, scales ahead add their own."""
    base = _gemv_loads_before_wait(1, 0)
    for depth in (1, 2, 3):
        codes_only = _gemv_loads_before_wait(depth, 0)
        assert codes_only == depth * base, (depth, codes_only, base)
        assert _gemv_loads_before_wait(depth, 1) > codes_only
    assert _gemv_loads_before_wait(2, 1, split=4) == _gemv_loads_before_wait(2, 1)


def test_tensor_core_kernel_compiles_with_pdl() -> None:
    sig = {"codes_ptr": "*i32", "scales_ptr": "*fp16", "x_ptr": "*i8", "sx_ptr": "*fp32",
           "qsum_ptr": "*i32", "bias_ptr": "*bf16", "out_ptr": "*bf16",
           **{k: "i32" for k in ("M", "N", "G", "stride_cn", "stride_sn", "stride_xm",
                                 "stride_gm", "stride_om", "SPLIT_K")}}
    consts = dict(BLOCK_M=16, BLOCK_N=64, ATOMIC=0, A8=1, FOLD_SCALE=0, HAS_BIAS=0,
                  DOT_F32=0, PDL=1)
    ptx = _ptx(triton_mma._pq2_tc_kernel, sig, consts)
    assert "griddepcontrol.wait" in ptx
    # the next kernel is let in after the main loop's tensor-core work, not at the start (it
    # may span several waves)
    last_mma = max(ptx.rfind("mma_async"), ptx.rfind("mma.sync"))
    assert 0 < last_mma < ptx.index("griddepcontrol.launch_dependents")


def test_dequantize_kernel_compiles_to_wide_accesses() -> None:
    """gemm_dq's one-pass dequantization lowers for sm_90 (bf16 out) and, with the 16-aligned
    pointers, word count and strides a launch specializes on, reads the codes and writes the
    dense rows 16 bytes at a time (the whole matrix goes through these stores)."""
    ast_source, target = _target()
    consts = dict(BLOCK_N=8, BLOCK_W=64, APPLY_SCALES=True)
    sig = {"codes_ptr": "*i32", "scales_ptr": "*fp16", "out_ptr": "*bf16",
           "scales_t_ptr": "*fp32",
           **{k: "i32" for k in ("N", "W", "G", "stride_cn", "stride_sn", "stride_on")},
           **{k: "constexpr" for k in consts}}
    # pointers, W (K/16 words: 320, 384, 1088 at Bonsai's K) and the strides
    aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 5, 7, 8, 9)}
    kernel = triton.compile(ast_source(triton_dequant._pq2_dequant_kernel, sig,
                                       constexprs=consts, attrs=aligned),
                            target=target, options={"num_warps": 4})
    ptx = kernel.asm["ptx"]
    assert "ld.global.v4.b32" in ptx, "code words not read 16 bytes at a time"
    stores = [line for line in ptx.splitlines() if "st.global" in line]
    assert stores and all(".v4." in line for line in stores), stores[:4]


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize("state", ["*fp32", "*bf16"])
@pytest.mark.parametrize("dims", [(16, 48, 128), (2, 4, 64)])
def test_gdn_verify_compiles_for_sm90(dims: tuple[int, int, int], state: str,
                                      prefetch: int) -> None:
    """The verification step's Gated DeltaNet kernel (kernels/gdn_verify.py): the 27B model's
    heads and the tiny model's, fp32 and bf16 state pools, with and without the next token's
    loads ahead; its dynamic token loop and the stores of each token's state must get through
    the GPU compiler."""
    from vllm_prism.kernels import gdn_verify

    h, hv, d = dims
    sig = {"qkv": "*bf16", "qkv_stride": "i32", "a": "*bf16", "a_stride": "i32", "b": "*bf16",
           "b_stride": "i32", "A_log": "*fp32", "dt_bias": "*fp32", "state": state,
           "state_stride": "i64", "indices": "*i32", "indices_stride": "i32",
           "num_accepted": "*i32", "cu_seqlens": "*i32", "out": "*bf16", "out_stride": "i32",
           "scale": "fp32"}
    ptx = _ptx(gdn_verify._gdn_verify_kernel, sig,
               dict(H=h, HV=hv, K=d, V=d, BV=gdn_verify.BLOCK_V,
                    THRESHOLD=gdn_verify.SOFTPLUS_THRESHOLD, PREFETCH=prefetch),
               num_warps=gdn_verify.NUM_WARPS)
    assert "st.global" in ptx
