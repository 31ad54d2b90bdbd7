"""benchmarks/kernels/sass_summary.py on a hand-written source-page CSV of two kernels: the
kernel filter, the stall shares, the opcodes' shares, the straight runs (instructions executed
equally often, merged, ranked by their samples) and the samples by executed count, each worked
out by hand below."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))

import sass_summary  # noqa: E402

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
          '"stall_long_sb","stall_wait","stall_long_sb (Not Issued)"')
CSV = "\n".join([
    '"Kernel Name","void decode_kernel(Params)",',
    HEADER,
    '"0x10","LDG.E R2, [R4.64]","9","10","9","0","9"',
    '"Kernel Name","void verify_kernel(Params)",',
    HEADER,
    '"0x10","S2R R0, SR_TID.X","1","4","0","1","0"',          # run 0-1: executed 4
    '"0x20","@!P0 BRA 0x40","6","4","6","0","6"',
    '"0x30","HGMMA.64x40x16.F32 R24, R124","2","8","0","2","0"',  # run 2-3: executed 8
    '"0x40","@P1 HGMMA.64x40x16.F32 R24, R128","1","8","1","0","1"',
    '"0x50","EXIT","0","4","0","0","0"',                       # run 4: executed 4 again
]) + "\n"


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "attn_sass.csv"
    path.write_text(CSV)
    return path


def test_reads_each_kernel_and_its_rows(tmp_path):
    kernels = sass_summary.read_kernels(str(_write(tmp_path)))
    assert [k.name for k in kernels] == ["void decode_kernel(Params)",
                                         "void verify_kernel(Params)"]
    assert [len(k.rows) for k in kernels] == [1, 5]


def test_opcodes_stalls_and_runs(tmp_path):
    verify = sass_summary.read_kernels(str(_write(tmp_path)))[1]
    assert [sass_summary.opcode(r["Source"]) for r in verify.rows] == [
        "S2R", "BRA", "HGMMA", "HGMMA", "EXIT"]
    # long_sb 6 + 1 = 7 of 10 samples, wait 1 + 2 = 3; "Not Issued" columns not counted
    assert sass_summary.stall_shares(verify.rows) == [("long_sb", 0.7), ("wait", 0.3)]
    # equal executed counts next to each other merge; a later equal count is a new run
    assert sass_summary.runs(verify.rows) == [(0, 1, 4.0, 7.0), (2, 3, 8.0, 3.0),
                                              (4, 4, 4.0, 0.0)]
    # by executed count, wherever the rows lie: count 4 (rows 0, 1, 4) 7 samples, 8 (rows 2,
    # 3) 3
    assert sass_summary.by_count(verify.rows) == [(4.0, 3, 7.0), (8.0, 2, 3.0)]


def test_command_line_filters_kernels(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernels" /
                                              "sass_summary.py"), str(_write(tmp_path)),
                          "--kernel", "verify", "--top", "2"],
                         capture_output=True, text=True, check=True)
    out = res.stdout
    assert "decode_kernel" not in out and "verify_kernel" in out
    assert "28 warp instructions executed, 10 stall samples" in out
    # HGMMA: 16 of 28 instructions, 3 of 10 samples; the top run holds 0.7 of the samples
    assert "| HGMMA | 0.571 | 0.300 |" in out
    assert "| 0-1 | 4 | 2 | 0.700 | `S2R R0, SR_TID.X` |" in out
    assert "| 4 | 3 | 0.700 |" in out and "| 8 | 2 | 0.300 |" in out
