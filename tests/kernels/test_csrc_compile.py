"""The torch-free CUDA kernels of csrc/ compile for Ampere (sm_80) and Hopper (sm_90) on a
machine without a GPU, when a CUDA toolkit is there: a compile error in a kernel that only the
GPU machine would build shows in CI. (The torch op wrappers need torch's CUDA headers and are
built with the extension on GPU machines.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc")
TORCH_FREE = ["csrc/pq2/mma_int8.cu", "csrc/pq2/gemv_int8.cu", "csrc/pq2/mma_small.cu",
              "csrc/pq2/mma_bulk.cu", "csrc/pq2/mma_lean.cu",
              "csrc/attention/int8_decode.cu", "csrc/attention/int8_verify.cu"]
# Built for the arch-specific sm_90a alone (CMakeLists.txt's prism_sm90a library).
SM90A = ["csrc/pq2/wgmma_prefill.cu", "csrc/attention/int8_verify_wgmma.cu"]
SM90A_FLAGS = ["-gencode", "arch=compute_90a,code=sm_90a"]


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
@pytest.mark.parametrize("arch", ["80", "90"])
@pytest.mark.parametrize("source", TORCH_FREE)
def test_kernel_compiles(source: str, arch: str, tmp_path: Path) -> None:
    res = subprocess.run([NVCC, "-c", "-std=c++17", "-O3", "--use_fast_math",
                          f"-arch=sm_{arch}", "-Xptxas", "-v", f"-I{ROOT / 'csrc'}",
                          str(ROOT / source), "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    # Every kernel instantiation compiled to a cubin entry without local-memory spills.
    entries = re.findall(r"Compiling entry function '([^']+)'", res.stderr)
    assert entries, res.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert all(int(s) == 0 for s in spills), res.stderr[-4000:]


# Declarations torch's CUDA headers need from the CUDA math libraries, which a bare toolkit
# may lack; the op wrappers use none of them (nothing is linked here).
_STUBS = {
    "cusparse.h": "typedef struct cusparseContext* cusparseHandle_t;\n"
                  "typedef enum { CUSPARSE_STATUS_SUCCESS = 0 } cusparseStatus_t;\n"
                  "const char* cusparseGetErrorString(cusparseStatus_t);\n",
    "cublas_v2.h": "typedef struct cublasContext* cublasHandle_t;\n"
                   "typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;\n",
    "cublasLt.h": "typedef struct cublasLtContext* cublasLtHandle_t;\n",
    "cusolverDn.h": "typedef struct cusolverDnContext* cusolverDnHandle_t;\n",
    "cusolver_common.h": "typedef enum { CUSOLVER_STATUS_SUCCESS = 0 } cusolverStatus_t;\n",
    "cudss.h": "typedef struct cudssContext* cudssHandle_t;\n"
               "typedef enum { CUDSS_STATUS_SUCCESS = 0 } cudssStatus_t;\n",
    "c10/cuda/impl/cuda_cmake_macros.h": "",
}
OP_SOURCES = ["csrc/torch_bindings.cpp", "csrc/pq2/dequantize.cu", "csrc/pq2/mma_int8_op.cu",
              "csrc/pq2/gemv_int8_op.cu", "csrc/pq2/mma_small_op.cu",
              "csrc/pq2/wgmma_prefill_op.cu",
              "csrc/attention/int8_decode_op.cu", "csrc/attention/int8_verify_op.cu"]


def _include_dirs(tmp: Path) -> list[str]:
    import sysconfig

    import torch.utils.cpp_extension as ext

    if not (Path(ext.include_paths()[0]) / "ATen" / "cuda" / "CUDAContext.h").is_file():
        pytest.skip("this torch has no CUDA headers")
    for name, text in _STUBS.items():
        path = tmp / "stubs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not any((Path(d) / name).is_file() for d in ("/usr/local/cuda/include",)):
            path.write_text("#pragma once\n" + text)
    return [f"-I{tmp / 'stubs'}", *(f"-I{p}" for p in ext.include_paths()),
            f"-I{sysconfig.get_paths()['include']}", f"-I{ROOT / 'csrc'}"]


@pytest.fixture(scope="module")
def op_objects(tmp_path_factory) -> dict[str, tuple[int, str, Path]]:
    """Every op source compiled once: ``{source: (returncode, stderr, object)}``."""
    if NVCC is None:
        pytest.skip("no CUDA toolkit (nvcc) on this machine")
    tmp = tmp_path_factory.mktemp("ops")
    inc = _include_dirs(tmp)

    def compile_one(source: str) -> tuple[int, str, Path]:
        obj = tmp / (Path(source).name + ".o")
        arch = SM90A_FLAGS if source in SM90A else ["-arch=sm_90"]
        res = subprocess.run([NVCC, "-c", "-std=c++17", "-x", "cu", *arch, "-DPRISM_HAS_SM90A=1",
                              *inc, str(ROOT / source), "-o", str(obj)],
                             capture_output=True, text=True, timeout=900)
        return res.returncode, res.stderr, obj

    # one compiler per core: parsing torch's headers is most of CI's compile time
    sources = OP_SOURCES + TORCH_FREE + SM90A
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        return dict(zip(sources, pool.map(compile_one, sources)))


@pytest.mark.parametrize("source", OP_SOURCES)
def test_op_wrapper_compiles(source: str, op_objects) -> None:
    """The torch ops (argument checks, allocation, launch) and their registration compile
    against the installed torch's headers, so a signature mismatch with the kernels shows in
    CI, not at the GPU machine's build (one with a schema string shows at load:
    test_csrc_bindings.py)."""
    rc, err, _ = op_objects[source]
    assert rc == 0, err[-4000:]


def test_every_symbol_of_ours_is_defined(op_objects) -> None:
    """What one object file calls of ours (the ops, the kernel launchers) another defines,
    so the extension links."""
    nm = shutil.which("nm")
    if nm is None or any(rc for rc, _, _ in op_objects.values()):
        pytest.skip("nm missing, or a source did not compile (its own test fails)")
    undefined, defined = set(), set()
    for _, _, obj in op_objects.values():
        for line in subprocess.run([nm, "-C", str(obj)], capture_output=True,
                                   text=True).stdout.splitlines():
            # "<address> <kind> <name>", or "<spaces> U <name>" for an undefined symbol
            parts = line.split(maxsplit=1 if line[:1].isspace() else 2)
            if len(parts) < 2:
                continue
            kind, name = parts[-2:] if len(parts) == 3 else parts
            if "pq2_" not in name and "vllm_prism::" not in name:
                continue
            (undefined if kind == "U" else defined).add(name)
    assert undefined, "no cross-file calls found: the symbol scan is broken"
    assert undefined <= defined, sorted(undefined - defined)


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_kv_copy_probe_compiles(tmp_path: Path) -> None:
    """The KV cache's copy-pattern probe (benchmarks/kernels/kv_copy_probe.cu, sm_90a) builds
    as scripts/gpu-session.sh kv-probe builds it, and its row layout is the verification
    kernel's: the same padded shared row (kSRow) for head size 256."""
    probe = ROOT / "benchmarks/kernels/kv_copy_probe.cu"
    res = subprocess.run([NVCC, "-std=c++17", "-O3", *SM90A_FLAGS, f"-I{ROOT / 'csrc'}",
                          str(probe), "-o", str(tmp_path / "probe")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (tmp_path / "probe").is_file()
    probe_row = re.search(r"constexpr int kSRow = (\d+);", probe.read_text())
    assert probe_row is not None, "kSRow not found in the probe"
    # the kernel's formula: 4 * (((kRow / 4 - 8 + 31) / 32) * 32 + 8), kRow = 2 * 256 + 8
    kernel = (ROOT / "csrc/attention/int8_verify_wgmma.cu").read_text()
    assert "kSRow = 4 * (((kRow / 4 - 8 + 31) / 32) * 32 + 8)" in kernel, \
        "the verification kernel's row formula changed: update the probe's kSRow"
    k_row = 2 * 256 + 8
    assert int(probe_row.group(1)) == 4 * (((k_row // 4 - 8 + 31) // 32) * 32 + 8)


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
@pytest.mark.parametrize("harness,kernel", [
    ("verify_trace.cu", "int8_verify_wgmma_kernel"),
    ("decode_trace.cu", "int8_decode_kernel")])
def test_attn_trace_compiles(harness: str, kernel: str, tmp_path: Path) -> None:
    """The attention kernels' timeline harnesses (benchmarks/kernels/verify_trace.cu,
    decode_trace.cu) build as scripts/gpu-session.sh attn-trace builds them, with the trace
    compiled in, and their traced kernels do not spill; the verification kernel keeps the
    extension's register plan, 168 registers a thread at launch (else the consumers'
    setmaxnreg.inc waits forever), so the timeline is the kernel's; and each reads a made-up
    timeline back right (`--selftest`, no GPU)."""
    res = subprocess.run([NVCC, "-std=c++17", "-O3", "--use_fast_math", *SM90A_FLAGS,
                          "-Xptxas", "-v", f"-I{ROOT / 'csrc'}",
                          str(ROOT / "benchmarks/kernels" / harness),
                          "-o", str(tmp_path / "trace"), "-keep", "-keep-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (tmp_path / "trace").is_file()
    ptx = "".join(f.read_text() for f in tmp_path.glob("*.ptx"))
    assert "globaltimer" in ptx, "the harness's kernel has no timeline"
    assert "%smid" in ptx, "the harness's kernel does not record its multiprocessor"
    regs = re.findall(rf"Compiling entry function '[^']*{kernel}[^']*'"
                      r"[^\n]*\n(?:[^\n]*\n){0,3}?[^\n]*Used (\d+) registers", res.stderr)
    assert regs, res.stderr[-4000:]
    if kernel == "int8_verify_wgmma_kernel":
        assert all(int(n) == 168 for n in regs), regs
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert spills and all(int(s) == 0 for s in spills), res.stderr[-4000:]
    # its reading of a timeline, on a made-up one whose steps it knows (no GPU needed)
    run = subprocess.run([str(tmp_path / "trace"), "--selftest"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert '"selftest": true' in run.stdout


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_decode_kernel_has_no_trace(tmp_path: Path) -> None:
    """decode_trace.cu's timeline is compiled out of the extension's decode kernel (the
    verification kernel's: test_wgmma_verify_compiles)."""
    ptx = tmp_path / "decode.ptx"
    res = subprocess.run([NVCC, "-ptx", "-std=c++17", "-O3", "--use_fast_math", "-arch=sm_90",
                          f"-I{ROOT / 'csrc'}", str(ROOT / "csrc/attention/int8_decode.cu"),
                          "-o", str(ptx)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    text = ptx.read_text()
    assert "int8_decode_kernel" in text
    assert "globaltimer" not in text and "attn_trace" not in text and "%smid" not in text


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_gemv_sweep_compiles(tmp_path: Path) -> None:
    """The GEMV's configuration sweep (benchmarks/kernels/pq2_gemv_sweep.cu) still builds
    against the kernel it includes (its quick form, the library's configurations only)."""
    res = subprocess.run([NVCC, "-std=c++17", "-O3", "-arch=sm_90", "-DPQ2_GEMV_DEFAULT_ONLY",
                          f"-I{ROOT / 'csrc'}", str(ROOT / "benchmarks/kernels/pq2_gemv_sweep.cu"),
                          "-o", str(tmp_path / "sweep")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (tmp_path / "sweep").is_file()


def test_small_sweep_compiles(op_objects, tmp_path: Path) -> None:
    """The small-batch kernels' geometry sweep (benchmarks/kernels/pq2_small_sweep.cu) still
    builds and links against the kernels it calls (the objects of mma_small.cu, mma_bulk.cu,
    mma_lean.cu and gemv_int8.cu compiled above, each its own translation unit, as
    scripts/gpu-session.sh small-sweep builds it)."""
    sweep = tmp_path / "sweep.o"
    res = subprocess.run([NVCC, "-c", "-std=c++17", "-O1", "-arch=sm_90", f"-I{ROOT / 'csrc'}",
                          str(ROOT / "benchmarks/kernels/pq2_small_sweep.cu"), "-o", str(sweep)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    kernels = ["csrc/pq2/mma_small.cu", "csrc/pq2/mma_bulk.cu", "csrc/pq2/mma_lean.cu",
               "csrc/pq2/gemv_int8.cu"]
    for source in kernels:
        assert op_objects[source][0] == 0, op_objects[source][1][-4000:]
    res = subprocess.run([NVCC, "-arch=sm_90", str(sweep),
                          *(str(op_objects[source][2]) for source in kernels),
                          "-o", str(tmp_path / "small-sweep")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (tmp_path / "small-sweep").is_file()


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_wgmma_prefill_compiles(tmp_path: Path) -> None:
    """The fused prefill GEMMs on warpgroup MMA (csrc/pq2/wgmma_prefill.cu, sm_90a: wgmma_cuda
    and the folded-scale wgmma_fold) build as CMake builds them: the integer warpgroup MMA
    with no compiler-inserted waits or serialization (ptxas's C7511 / C7517 / C7518 notes),
    the producer's bulk copies, the fold kernel's register hand-over (setmaxnreg), no
    spills."""
    res = subprocess.run([NVCC, "-c", "-std=c++17", "-O3", "--use_fast_math", *SM90A_FLAGS,
                          "-Xptxas", "-v", f"-I{ROOT / 'csrc'}", str(ROOT / SM90A[0]),
                          "-o", str(tmp_path / "k.o")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    for kernel in ("gemm_kernel", "quantize_tiled_kernel", "fold_gemm_kernel",
                   "quantize_fold_kernel"):
        assert kernel in res.stderr, kernel
    for note in ("C7511", "C7517", "C7518"):
        assert note not in res.stderr, res.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert spills and all(int(s) == 0 for s in spills), res.stderr[-4000:]
    sass = _sass(tmp_path / "k.o")
    if sass is not None:
        assert "IGMMA.64x128x32.S8.S8" in sass and "UBLKCP" in sass
        assert "USETMAXREG.DEALLOC" in sass and "USETMAXREG.TRY_ALLOC" in sass


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_wgmma_verify_compiles(tmp_path: Path) -> None:
    """The verification attention kernel on warpgroup MMA (csrc/attention/int8_verify_wgmma.cu,
    sm_90a) builds as CMake builds it: every (head size, n-tiles, maxima) form it launches
    (128 / 256 x 1..6, lazy and exact), the fp16 MMAs with their A operands in registers issued
    without compiler-inserted waits or serialization (ptxas's C7510-C7520 notes), no spills."""
    res = subprocess.run([NVCC, "-c", "-std=c++17", "-O3", "--use_fast_math", *SM90A_FLAGS,
                          "-Xptxas", "-v", f"-I{ROOT / 'csrc'}", str(ROOT / SM90A[1]),
                          "-o", str(tmp_path / "k.o"), "-keep", "-keep-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    entries = re.findall(r"int8_verify_wgmma_kernelILi(\d+)ELi(\d+)ELb([01])E", res.stderr)
    assert {(int(h), int(n), int(lm)) for h, n, lm in entries} == {
        (h, n, lm) for h in (128, 256) for n in range(1, 7) for lm in (0, 1)}
    assert not re.search(r"C75[12]\d", res.stderr), res.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert spills and all(int(s) == 0 for s in spills), res.stderr[-4000:]
    # the producers hand back from the launch's registers what the consumers take
    # (setmaxnreg: 56 a producer thread, 224 a consumer thread, 384 x 168 in all): ptxas
    # must give the 384-thread kernel its full 168 a thread at launch, else the consumers'
    # setmaxnreg.inc would wait forever
    used = [int(n) for n in re.findall(r"Used (\d+) registers", res.stderr)]
    assert used and all(n == 168 for n in used), used
    # benchmarks/kernels/verify_trace.cu's timeline is compiled out of the extension's kernel
    ptx = "".join(f.read_text() for f in tmp_path.glob("*.ptx"))
    assert ptx and "globaltimer" not in ptx and "attn_trace" not in ptx and "%smid" not in ptx
    sass = _sass(tmp_path / "k.o")
    if sass is not None:
        assert "HGMMA.64x40x16.F32" in sass
        assert "USETMAXREG.DEALLOC" in sass and "USETMAXREG.TRY_ALLOC" in sass
    # the PTX the build kept (no cuobjdump needed): the MMA of every width from registers,
    # and the proxy fence that publishes Q^T and P^T to it
    ptx = (tmp_path / "int8_verify_wgmma.ptx").read_text()
    for n in range(8, 49, 8):
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16" in ptx, n
    assert "fence.proxy.async.shared::cta" in ptx and "movmatrix.sync.aligned" in ptx
    # both producers: the rows by cp.async (arriving on the full mbarrier), the tiles as TMA
    # boxes of the tensor map parameter
    assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in ptx
    assert ("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
            in ptx)


_TMA_LAYOUT_HARNESS = r"""
#include <cstdio>
#include "attention/int8_attention.cuh"
// each line of stdin: cache address, block / head / slot strides (bytes), KV heads, row bytes;
// prints int8_verify_tma_layout's verdict (1 / 0)
int main() {
  unsigned long long addr;
  long long cb, ch, cn, row;
  int nkv;
  while (std::scanf("%llu %lld %lld %lld %d %lld", &addr, &cb, &ch, &cn, &nkv, &row) == 6) {
    vllm_prism::Int8AttnParams p{};
    p.cache = reinterpret_cast<const int8_t*>(addr);
    p.stride_cb = cb; p.stride_ch = ch; p.stride_cn = cn; p.num_kv_heads = nkv;
    std::printf("%d\n", vllm_prism::int8_verify_tma_layout(p, row) ? 1 : 0);
  }
  return 0;
}
"""


def _cache_views(torch):
    """The kernels' [blocks, KV heads, block size, row] views of int8 caches: vLLM's NHD and
    HND layouts, head sizes 64-256, 1-4 KV heads, padded heads or blocks, offset bases."""
    for hd in (64, 128, 256):
        row = 2 * hd + 8
        for nkv in (1, 2, 3, 4):
            for pad_head, pad_block in ((0, 0), (8, 0), (0, 8), (4, 0), (16, 16)):
                for base in (0, 8, 4, 16):
                    buf = torch.empty(1 << 20, dtype=torch.int8)
                    head = row + pad_head
                    nhd_slot = nkv * head
                    nhd_block = 16 * nhd_slot + pad_block
                    yield hd, buf.as_strided((3, nkv, 16, row), (nhd_block, head, nhd_slot, 1),
                                             base)
                    hnd_block = nkv * 16 * head + pad_block
                    yield hd, buf.as_strided((3, nkv, 16, row), (hnd_block, 16 * head, head, 1),
                                             base)


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_tma_layout_check_matches_python(tmp_path: Path) -> None:
    """The op's refusal of caches its tensor map cannot cover (int8_verify_tma_layout, C++)
    and the Python router's (cuda_decode.tma_layout_problem, which sends those caches to the
    cp.async producer) state one rule twice: over NHD / HND caches, padded heads and blocks
    and offset bases they must agree, and both must take vLLM's plain NHD layout."""
    import torch

    from vllm_prism.attention.ops.cuda_decode import tma_layout_problem

    src = tmp_path / "harness.cu"
    src.write_text(_TMA_LAYOUT_HARNESS)
    res = subprocess.run([NVCC, "-std=c++17", f"-I{ROOT / 'csrc'}", str(src), "-o",
                          str(tmp_path / "harness")], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    views = list(_cache_views(torch))
    lines = "".join(f"{v.data_ptr()} {v.stride(0)} {v.stride(1)} {v.stride(2)} {v.shape[1]} "
                    f"{2 * hd + 8}\n" for hd, v in views)
    out = subprocess.run([str(tmp_path / "harness")], input=lines, capture_output=True,
                         text=True, timeout=60).stdout.split()
    assert len(out) == len(views)
    python = [tma_layout_problem(v, hd) is None for hd, v in views]
    cpp = [o == "1" for o in out]
    mismatch = [(hd, v.stride(), v.data_ptr() % 16) for (hd, v), a, b in zip(views, python, cpp)
                if a != b]
    assert not mismatch, mismatch[:5]
    # both ways occur, and the plain NHD cache (no padding, aligned base) is taken where its
    # slots are 16-byte multiples (KV heads x (2 hd + 8) bytes; an odd head count at these
    # head sizes leaves them 8 mod 16, which the tensor map's strides cannot take)
    assert any(python) and not all(python)
    plain = [ok for (hd, v), ok in zip(views, python)
             if v.data_ptr() % 16 == 0 and v.stride(1) == 2 * hd + 8 and v.stride(2) % 16 == 0
             and v.stride(2) == v.shape[1] * v.stride(1) and v.stride(0) == 16 * v.stride(2)]
    assert plain and all(plain)


def _sass(obj: Path) -> str | None:
    """cuobjdump's SASS of an object, or None where cuobjdump is missing."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    return subprocess.run([tool, "--dump-sass", str(obj)], capture_output=True,
                          text=True).stdout


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_wgmma_sweep_compiles(tmp_path: Path) -> None:
    """The sweep of the warpgroup-MMA prefill GEMM (benchmarks/kernels/pq2_wgmma_sweep.cu,
    sm_90a only) builds as scripts/wgmma-sweep.sh builds it without cuBLAS: the library's
    kernel and its quantization pass, without spills."""
    res = subprocess.run([NVCC, "-std=c++17", "-O3", *SM90A_FLAGS,
                          "-Xptxas", "-v", f"-I{ROOT / 'csrc'}",
                          str(ROOT / "benchmarks/kernels/pq2_wgmma_sweep.cu"),
                          "-o", str(tmp_path / "sweep")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "gemm_kernel" in res.stderr and "fold_gemm_kernel" in res.stderr
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert spills and all(int(s) == 0 for s in spills), res.stderr[-4000:]
    assert (tmp_path / "sweep").is_file()
