"""benchmarks/e2e/bench_startup.py: its Triton timers add each compile and each autotuning
benchmark to the kernel they belong to and pass calls through; and it starts the tiny Bonsai
model through ``LLM()`` on the CPU end to end, writing a record and its table."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")
triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "e2e"))

import bench_startup  # noqa: E402


def _kernel(x):  # stands for a kernel's Python function
    return x


def test_the_timers_count_per_kernel_and_pass_through(monkeypatch) -> None:
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    def slow_compile(self, key):
        time.sleep(0.02)
        return f"compiled {key}"

    def failing_bench(self, config):
        time.sleep(0.01)
        raise RuntimeError(f"config {config} out of resources")

    monkeypatch.setattr(JITFunction, "_do_compile", slow_compile)
    monkeypatch.setattr(Autotuner, "_bench", failing_bench)
    compiles, tuning = bench_startup.instrument_triton()
    jit = type("Jit", (), {"fn": _kernel})()
    tuner = type("Tuner", (), {"base_fn": _kernel})()
    assert JITFunction._do_compile(jit, "a") == "compiled a"
    assert JITFunction._do_compile(jit, "b") == "compiled b"
    with pytest.raises(RuntimeError, match="config 3"):
        Autotuner._bench(tuner, 3)
    name = "test_bench_startup._kernel"
    assert dict(compiles.calls) == {name: 2} and dict(tuning.calls) == {name: 1}
    assert 0.04 <= compiles.seconds[name] < 1.0 and 0.01 <= tuning.seconds[name] < 1.0


def test_a_cpu_start_writes_its_record(tiny_gguf, tmp_path) -> None:
    from conftest import run_python

    script = ROOT / "benchmarks" / "e2e" / "bench_startup.py"
    proc = run_python([str(script), str(tiny_gguf()), "--kv", "auto", "--max-len", "256",
                       "--gpu", "cpu", "--out", str(tmp_path)], script.parent, timeout=600,
                      VLLM_CPU_KVCACHE_SPACE="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = json.loads((tmp_path / "startup_cpu.json").read_text())["records"]
    assert 0 < rec["start_s"] < 600 and rec["kv"] == "auto", rec
    assert all(k["compile_s"] >= 0 and k["autotune_s"] >= 0 for k in rec["kernels"])
    table = (tmp_path / "startup_cpu.md").read_text()
    assert f"LLM() ready in {rec['start_s']:.1f} s" in table
