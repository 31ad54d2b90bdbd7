"""The attention timeline harnesses launch what the op launches.

benchmarks/kernels/decode_trace.cu and verify_trace.cu (scripts/gpu-session.sh attn-trace)
time the INT8 decode and verification kernels outside torch: they fill the kernels'
parameters themselves and restate the op's split plan (attn_trace_common.cuh: the segments a
request or (request, KV head), the CTAs a multiprocessor, the smallest segment) and the
27B-shaped layer. A timeline is the served kernel's only while those agree with
vllm_prism/attention/ops/cuda_decode.py (num_cuda_segments) and the bonsai-2-27b shape of
vllm_prism/gguf/tiny.py; these tests read the harnesses' constants and run their segment
count against split_count over many GPUs' multiprocessor counts, so a change to either side
fails here instead of quietly timing another plan.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_prism.attention.ops import cuda_decode
from vllm_prism.gguf.tiny import SHAPES

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "benchmarks" / "kernels"
COMMON = KERNELS / "attn_trace_common.cuh"
NVCC = shutil.which("nvcc")
# multiprocessor counts of the GPUs the product names (A100 108, H100 SXM 132, H100 PCIe 114,
# H200 132, RTX 4090 128, RTX 3090 82, L40S 142) and a spread around them
SMS = sorted({1, 2, 7, 46, 82, 108, 114, 128, 132, 142, 160, 264})


def _constant(path: Path, name: str) -> int:
    m = re.search(rf"constexpr int {name}\s*=\s*(\d+)\s*;", path.read_text())
    assert m, f"{name} not found in {path}"
    return int(m.group(1))


def test_split_constants_are_the_ops() -> None:
    assert _constant(COMMON, "kMinTiles") == cuda_decode.MIN_TILES
    assert _constant(COMMON, "kMaxSegments") == cuda_decode.MAX_SEGMENTS
    assert _constant(KERNELS / "decode_trace.cu", "kCtasPerSm") == cuda_decode.CTAS_PER_SM
    assert (_constant(KERNELS / "verify_trace.cu", "kCtasPerSm")
            == cuda_decode.VERIFY_CTAS_PER_SM)
    assert _constant(COMMON, "kBlock") == cuda_decode.TILE


def test_layer_shape_is_the_27b_files() -> None:
    cfg = SHAPES["bonsai-2-27b"]
    assert _constant(COMMON, "kKvHeads") == cfg.n_kv_heads
    assert _constant(COMMON, "kGroup") == cfg.n_heads // cfg.n_kv_heads
    assert _constant(COMMON, "kHD") == cfg.head_dim


@pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
def test_segment_count_is_split_count(tmp_path: Path) -> None:
    """attn_trace_common::num_segments, compiled as the harnesses compile it, against
    cuda_decode.num_cuda_segments for decode (one group a request) and verification (a
    group a (request, KV head)) at every multiprocessor count of SMS."""
    main = tmp_path / "plan.cu"
    main.write_text(
        # as decode_trace.cu includes it: behind a traced kernel
        '#define PRISM_ATTN_TRACE 1\n#include "attention/attn_trace.cuh"\n'
        '#include "attn_trace_common.cuh"\n#include <cstdio>\n#include <cstdlib>\n'
        "int main(int argc, char** argv) {\n"
        "  for (int i = 1; i + 2 < argc; i += 3)\n"
        '    std::printf("%d\\n", attn_trace_common::num_segments(std::atoi(argv[i]), '
        "std::atoi(argv[i + 1]), std::atoi(argv[i + 2])));\n"
        "  return 0;\n}\n")
    res = subprocess.run([NVCC, "-std=c++17", "-O1", "-arch=sm_80", f"-I{KERNELS}",
                          f"-I{ROOT / 'csrc'}", str(main), "-o", str(tmp_path / "plan")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    kv = _constant(COMMON, "kKvHeads")
    cases = [(sms, 1, cuda_decode.CTAS_PER_SM) for sms in SMS]
    cases += [(sms, kv, cuda_decode.VERIFY_CTAS_PER_SM) for sms in SMS]
    args = [str(v) for case in cases for v in case]
    run = subprocess.run([str(tmp_path / "plan"), *args], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    got = [int(x) for x in run.stdout.split()]
    want = [cuda_decode.num_cuda_segments(1, sms, groups, per_sm)
            for sms, groups, per_sm in cases]
    assert got == want, list(zip(cases, got, want))
