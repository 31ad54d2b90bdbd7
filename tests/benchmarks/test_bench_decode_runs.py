"""The engines benchmarks/e2e/bench_decode.py starts, as each child process parses its command
line: the plain engines of a ``--spec-k`` run carry no drafter (on 2026-12-01 they inherited
``--spec-k 3 5 7`` and vLLM refused them), the DFlash engines one k each at batch 1, and
``--side-by-side`` gives each engine its turn lock, a share of the GPU memory and an explicit
KV-cache size. No GPU: only the command lines are built and parsed."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "e2e"))
import bench_decode  # noqa: E402


def _children(argv: list[str], lock: str | None = None) -> list[tuple]:
    """(parsed child args, env) of every engine of ``argv``."""
    parser = bench_decode.build_parser()
    args = parser.parse_args(argv)
    runs = bench_decode.engine_runs(args, argv, "/tmp/drafter" if args.spec_k else None, lock)
    out = []
    for cmd, env, _ in runs:
        assert cmd[1] == bench_decode.__file__ and cmd[2] == "--child"
        out.append((parser.parse_args(cmd[2:]), env))
    return out


def test_spec_k_run_has_one_plain_engine_and_one_engine_per_k() -> None:
    kids = _children(["m.gguf", "--kv", "auto", "--spec-k", "3", "5", "7", "--batches", "1"])
    assert [a.spec_k for a, _ in kids] == [[], [3], [5], [7]]
    plain, spec = kids[0][0], [a for a, _ in kids[1:]]
    assert plain.drafter is None and plain.turn_lock is None
    assert all(a.drafter == "/tmp/drafter" and a.batches == [1] for a in spec)
    assert all(a.child for a, _ in kids)


def test_spec_only_drops_the_plain_engine() -> None:
    kids = _children(["m.gguf", "--kv", "int8_per_token_head", "--spec-k", "5", "--spec-only",
                      "--attn-kernel", "auto", "cuda"])
    assert [a.spec_k for a, _ in kids] == [[5], [5]]
    assert [env["VLLM_PRISM_ATTN_KERNEL"] for _, env in kids] == ["auto", "cuda"]


def test_served_default_is_pdl_on() -> None:
    assert [env["VLLM_PRISM_PDL"] for _, env in _children(["m.gguf", "--kv", "auto"])] == ["1"]


def test_side_by_side_engines_share_the_memory_and_take_turns() -> None:
    argv = ["m.gguf", "--kv", "auto", "int8_per_token_head", "--gpu-memory", "0.8",
            "--side-by-side", "--kv-cache-gib", "3"]
    kids = _children(argv, lock="/tmp/turn")
    assert [a.kv for a, _ in kids] == [["auto"], ["int8_per_token_head"]]
    for a, _ in kids:
        assert a.turn_lock == "/tmp/turn" and a.engines == 2
        assert a.gpu_memory == pytest.approx(0.4)
        assert a.kv_cache_gib == 3


@pytest.mark.parametrize("flag,env_name,values", [
    ("--pdl", "VLLM_PRISM_PDL", ["1", "0"]),
    ("--pq2-kernel", "VLLM_PRISM_PQ2_KERNEL", ["auto", "gemm_dq"]),
    ("--dense-gemv", "VLLM_PRISM_DENSE_GEMV", ["torch", "triton"]),
])
def test_each_switch_value_gets_its_own_engine(flag: str, env_name: str,
                                               values: list[str]) -> None:
    kids = _children(["m.gguf", "--kv", "auto", flag, *values])
    assert [env[env_name] for _, env in kids] == values


def test_the_gdn_spec_kernel_switch_varies_only_the_engines_with_a_drafter(monkeypatch) -> None:
    """``--gdn-spec-kernel`` (vLLM's VLLM_GDN_DECODE_KERNEL, read for speculative decoding
    only) gives every DFlash engine each value and the plain engine one run; a DFlash
    engine's label names the value it sets."""
    monkeypatch.setenv("VLLM_GDN_DECODE_KERNEL", "triton")
    kids = _children(["m.gguf", "--kv", "int8_per_token_head", "--spec-k", "5",
                      "--gdn-spec-kernel", "auto", "cuda"])
    # auto: the variable unset (the model's choice), even where this process has it
    assert [(a.spec_k, env.get("VLLM_GDN_DECODE_KERNEL")) for a, env in kids] == [
        ([], None), ([5], None), ([5], "cuda")]
    for name in ("VLLM_PRISM_PQ2_KERNEL", "VLLM_PRISM_GEMV_TUNING", "VLLM_PRISM_DENSE_GEMV",
                 "VLLM_PRISM_DRAFT_ATTENTION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_GDN_DECODE_KERNEL", "triton")
    assert bench_decode._kernel_label(drafter=True) == "auto [gdn triton]"
    assert bench_decode._kernel_label(drafter=False) == "auto"
    monkeypatch.delenv("VLLM_GDN_DECODE_KERNEL")
    assert bench_decode._kernel_label(drafter=True) == "auto"


def test_the_gdn_verify_switch_varies_only_the_engines_with_a_drafter(monkeypatch) -> None:
    """``--gdn-verify vllm prism``: each DFlash engine gets each value, the plain engine the
    first alone; a DFlash engine's label names the value other than the default."""
    kids = _children(["m.gguf", "--kv", "int8_per_token_head", "--spec-k", "5",
                      "--gdn-verify", "vllm", "prism"])
    assert [(a.spec_k, env["VLLM_PRISM_GDN_VERIFY"]) for a, env in kids] == [
        ([], "vllm"), ([5], "vllm"), ([5], "prism")]
    for name in ("VLLM_PRISM_PQ2_KERNEL", "VLLM_PRISM_GEMV_TUNING", "VLLM_PRISM_DENSE_GEMV",
                 "VLLM_PRISM_DRAFT_ATTENTION", "VLLM_GDN_DECODE_KERNEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_PRISM_GDN_VERIFY", "vllm")
    assert bench_decode._kernel_label(drafter=True) == "auto [gdn verify vllm]"
    assert bench_decode._kernel_label(drafter=False) == "auto"


def test_engine_process_switch(monkeypatch) -> None:
    """``--engine-process 0 1``: an engine with its core in the benchmark's process and one
    with its core in its own process (labelled), each kind of engine."""
    kids = _children(["m.gguf", "--kv", "auto", "--spec-k", "5", "--engine-process", "0", "1"])
    assert [(a.spec_k, env["VLLM_ENABLE_V1_MULTIPROCESSING"]) for a, env in kids] == [
        ([], "0"), ([5], "0"), ([], "1"), ([5], "1")]
    for name in ("VLLM_PRISM_PQ2_KERNEL", "VLLM_PRISM_GEMV_TUNING", "VLLM_PRISM_DENSE_GEMV",
                 "VLLM_PRISM_DRAFT_ATTENTION", "VLLM_PRISM_GDN_VERIFY", "VLLM_GDN_DECODE_KERNEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert bench_decode._kernel_label(drafter=False) == "auto [engine process]"
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert bench_decode._kernel_label(drafter=True) == "auto"


@pytest.mark.parametrize("option, name, values, label", [
    ("--fresh-kv", "VLLM_PRISM_PREFILL_FRESH_KV", ["1", "0"], "[fresh kv 0]"),
    ("--fold-prefill", "VLLM_PRISM_PQ2_FOLD_PREFILL", ["0", "1"], "[fold prefill]"),
    ("--attn-decode-split", "VLLM_PRISM_ATTN_DECODE_SPLIT", ["auto", "1"], "[decode split 1]"),
    ("--attn-pdl", "VLLM_PRISM_ATTN_PDL", ["1", "0"], "[attn pdl 0]"),
])
def test_engine_switch(option, name, values, label, monkeypatch) -> None:
    """An engine switch with two values (the context-0 prefill on the step's own K / V; the
    folded-scale prefill kernel; the INT8 decode kernel's two warps a (tile, KV head) or one;
    the attention kernels' programmatic dependent launch): each kind of engine with each
    value, the second labelled, the default not."""
    kids = _children(["m.gguf", "--kv", "int8_per_token_head", option, *values])
    assert [env[name] for _, env in kids] == values
    for _, other, _ in bench_decode.ENGINE_SWITCHES:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, values[1])
    assert bench_decode._kernel_label(drafter=False) == f"auto {label}"
    monkeypatch.setenv(name, values[0])
    assert bench_decode._kernel_label(drafter=False) == "auto"


def test_the_drafter_switch_varies_only_the_engines_with_a_drafter() -> None:
    """``--draft-attention`` gives every DFlash engine each value, the plain engine (which has
    no drafter to switch) one run; a verify record's step ratio is over that plain step."""
    kids = _children(["m.gguf", "--kv", "int8_per_token_head", "--spec-k", "5",
                      "--draft-attention", "vllm", "prism"])
    assert [(a.spec_k, env["VLLM_PRISM_DRAFT_ATTENTION"]) for a, env in kids] == [
        ([], "vllm"), ([5], "vllm"), ([5], "prism")]
    base = {"kind": "decode", "batch": 1, "context": 4, "ms_per_step": 2.0, "kv": "k",
            "mode": "default", "pq2_kernel": "auto"}
    spec = [{**base, "kind": "verify", "ms_per_step": 3.0},
            {**base, "kind": "verify", "ms_per_step": 5.0,
             "pq2_kernel": "auto [draft attention vllm]"}]
    bench_decode._add_verify_ratios([base, *spec])
    assert [r["ratio_to_plain"] for r in spec] == [1.5, 2.5]


# the verification kernel's switches: (option, variable, its default, the other value, the
# label an engine with the other value gets)
VERIFY_SWITCHES = [("--attn-verify-lazy", "VLLM_PRISM_ATTN_VERIFY_LAZY", "1", "0",
                    "[verify lazy 0]"),
                   ("--attn-verify-form", "VLLM_PRISM_ATTN_VERIFY_FORM", "auto", "wgmma",
                    "[verify form wgmma]")]


@pytest.mark.parametrize("switch", VERIFY_SWITCHES, ids=lambda s: s[0])
def test_verify_switch_varies_only_the_engines_with_a_drafter(switch, monkeypatch) -> None:
    """``--attn-verify-lazy 1 0`` (the verification kernel's lazy maxima or the exact softmax)
    and ``--attn-verify-form mma wgmma`` (its mma.sync or warpgroup-MMA form): the DFlash
    engines with each value (the other labelled), the plain engine once; both verify records
    get their ratio over that plain step."""
    option, name, default, other, label = switch
    kids = _children(["m.gguf", "--kv", "int8_per_token_head", "--spec-k", "5", option,
                      default, other])
    assert [(a.spec_k, env[name]) for a, env in kids] == [
        ([], default), ([5], default), ([5], other)]
    for var in ("VLLM_PRISM_PQ2_KERNEL", "VLLM_PRISM_GEMV_TUNING", "VLLM_PRISM_DENSE_GEMV",
                "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_PRISM_PREFILL_FRESH_KV",
                "VLLM_PRISM_ATTN_DECODE_SPLIT", "VLLM_PRISM_DRAFT_ATTENTION",
                "VLLM_PRISM_GDN_VERIFY", "VLLM_GDN_DECODE_KERNEL",
                "VLLM_PRISM_ATTN_VERIFY_LAZY", "VLLM_PRISM_ATTN_VERIFY_FORM"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(name, other)
    assert bench_decode._kernel_label(drafter=True) == f"auto {label}"
    assert bench_decode._kernel_label(drafter=False) == "auto"
    monkeypatch.setenv(name, default)
    assert bench_decode._kernel_label(drafter=True) == "auto"
    base = {"kind": "decode", "batch": 1, "context": 4, "ms_per_step": 2.0, "kv": "k",
            "mode": "default", "pq2_kernel": "auto"}
    spec = [{**base, "kind": "verify", "ms_per_step": 3.0},
            {**base, "kind": "verify", "ms_per_step": 4.0, "pq2_kernel": f"auto {label}"}]
    bench_decode._add_verify_ratios([base, *spec])
    assert [r["ratio_to_plain"] for r in spec] == [1.5, 2.0]


@pytest.mark.parametrize("stage", ["ready", "done"])
def test_barrier_waits_for_every_engine_then_lets_go(tmp_path, stage: str) -> None:
    """Side-by-side engines measure only once all are warm, and leave only once all have
    measured; a missing engine holds the others no longer than the timeout."""
    lock = str(tmp_path / "turn")
    Path(f"{lock}.{stage}").write_text("111\n")  # one engine already there
    t0 = time.monotonic()
    bench_decode._barrier(lock, 2, 30.0, stage)  # this one is the second: no wait
    assert time.monotonic() - t0 < 5
    assert len(Path(f"{lock}.{stage}").read_text().splitlines()) == 2
    t0 = time.monotonic()
    bench_decode._barrier(lock, 5, 1.0, stage)  # two more never come
    assert 1.0 <= time.monotonic() - t0 < 5


def test_a_side_by_side_engine_leaves_only_after_every_engine_measured(monkeypatch) -> None:
    """The order of one side-by-side engine: warm-up, the "ready" barrier, its measurement in
    its turn, the turn given back, then the "done" barrier before it exits (an engine that
    exits during another's measurement disturbs it)."""
    events: list[str] = []
    args = bench_decode.build_parser().parse_args(
        ["m.gguf", "--kv", "auto", "--child", "--turn-lock", "/tmp/t", "--engines", "3"])

    class Exited(Exception):
        pass

    @contextlib.contextmanager
    def turn(lock):
        events.append("turn")
        yield
        events.append("turn given back")

    def leave(code):
        events.append(f"exit {code}")
        raise Exited

    monkeypatch.setattr(bench_decode, "_engine", lambda a: object())
    monkeypatch.setattr(bench_decode, "_warm_up", lambda llm, a: events.append("warm"))
    monkeypatch.setattr(bench_decode, "_measure", lambda llm, a: events.append("measure") or [])
    monkeypatch.setattr(bench_decode, "_measure_turn", turn)
    monkeypatch.setattr(bench_decode, "_barrier",
                        lambda lock, n, timeout_s=240.0, stage="ready":
                        events.append(f"{stage} barrier of {n}"))
    monkeypatch.setattr(bench_decode.os, "_exit", leave)
    with pytest.raises(Exited):
        bench_decode.run_engine(args)
    assert events == ["warm", "ready barrier of 3", "turn", "measure", "turn given back",
                      "done barrier of 3", "exit 0"]


def test_a_child_echoes_its_measurements_and_vllms_startup_lines(capsys) -> None:
    """The child's stdout: RECORDS lines are returned, measurement lines ({...}) and vLLM's
    lines on where the start went (loading, compiling, graph capture) are echoed, the rest
    of vLLM's log is not."""
    code = ("print('INFO [loader.py] Loading weights took 3.20 seconds'); "
            "print('INFO [backends.py] Compiling a graph for dynamic shape takes 41.2 s'); "
            "print('INFO [core.py] some other line'); print('{\"warm\": [1]}'); "
            "print('RECORDS []')")
    returncode, lines = bench_decode._run_child([sys.executable, "-c", code],
                                                dict(os.environ), "echo")
    err = capsys.readouterr().err
    assert returncode == 0 and lines == ["RECORDS []"]
    assert "Loading weights took 3.20" in err and "takes 41.2 s" in err and '{"warm"' in err
    assert "some other line" not in err


def test_a_failed_engine_does_not_hold_the_barrier(tmp_path) -> None:
    """An engine that dies counts as arrived at both barriers: the other engine passes them at
    once instead of after their timeouts."""
    lock = str(tmp_path / "turn")
    code, lines = bench_decode._run_child([sys.executable, "-c", "raise SystemExit(3)"],
                                          dict(os.environ), "dies", lock)
    assert code == 3 and lines == []
    for stage in ("ready", "done"):
        t0 = time.monotonic()
        bench_decode._barrier(lock, 2, 30.0, stage)
        assert time.monotonic() - t0 < 5, stage


def test_profile_divides_by_the_steps_the_counter_saw(monkeypatch) -> None:
    """A verify step's profile: the kernel time of the longer traced call minus the shorter
    one's, over the difference of their counted steps (vLLM's verify steps), not over the
    difference of their token counts."""
    # the last item: each kernel's start times; "fill" runs once a step in the longer call
    traces = iter([(100.0, {"pq2_linear": 80.0}, 10, {"pq2_gemv": (80.0, 10, 60.0)},
                    {"pq2_gemv": [0.0, 1.0, 2.0]}),
                   (300.0, {"pq2_linear": 240.0}, 30,
                    {"pq2_gemv": (200.0, 25, 160.0), "fill": (40.0, 5, 40.0)},
                    {"pq2_gemv": [0.0, 5.0, 9.0, 20.0], "fill": [0.0, 40.0, 100.0, 150.0,
                                                                  200.0, 250.0]})] * 2)
    monkeypatch.setattr(bench_decode, "_trace", lambda llm, prompts, n: next(traces))
    monkeypatch.setattr(bench_decode, "_timed", lambda *args: 0.0)
    counts = iter([0, 3, 11])  # 3 verify steps in the short call, 8 in the long one
    out = bench_decode._profile(None, [], 8, 1e-3, counter=lambda: next(counts))
    assert out["kernel_us_per_step"] == {"pq2_linear": 32.0}  # (240 - 80) / (8 - 3)
    assert out["busy_us_per_step"] == 40.0 and out["kernels_per_step"] == 4.0
    assert out["traced_step_us"] == 52.5  # "fill"'s launches after its first: (250 - 40) / 4
    assert out["top_kernels_per_step"] == [  # by name: (200 - 80) / 5 us, (25 - 10) / 5 launches
        {"name": "pq2_gemv", "family": "pq2_linear", "us": 24.0, "launches": 3.0,
         "own_us": 20.0},
        {"name": "fill", "family": "norm_elementwise", "us": 8.0, "launches": 1.0,
         "own_us": 8.0}]
    assert out["kernel_own_us_per_step"] == {"pq2_linear": 20.0, "norm_elementwise": 8.0}
    plain = bench_decode._profile(None, [], 8, 1e-3)  # 4 and 8 decode steps
    assert plain["kernel_us_per_step"] == {"pq2_linear": 40.0}
    assert "traced_step_us" not in plain  # no kernel launched once a step there


def test_traced_step_is_the_mean_interval_of_a_once_a_step_kernel() -> None:
    """The step period of a profiled call: from the starts of a kernel launched once a step
    on average, after its first launch (the prefill's: a late first step does not enter),
    not from kernels launched more or less often; a kernel launched twice in one step and
    not in the next gives the mean period, where the median interval would be 10."""
    starts = {"a [1,1,1]": [0.0, 900.0, 1000.0, 1100.0, 1200.0, 1310.0],
              "b": [float(i) for i in range(40)], "c [2,1,1]": [5.0, 1005.0, 1105.0]}
    assert bench_decode.traced_step_us({"a [1,1,1]": 1.0, "b": 8.0, "c [2,1,1]": 0.5},
                                       starts) == 102.5
    assert bench_decode.traced_step_us({"b": 8.0}, starts) is None
    pairs = {"d": [0.0, 100.0, 110.0, 300.0, 310.0, 500.0, 510.0]}
    assert bench_decode.traced_step_us({"d": 1.0}, pairs) == 82.0  # (510 - 100) / 5


def test_own_time_gives_each_instant_to_the_earliest_running_kernel() -> None:
    """A producer runs 0-10; the GEMV launched early by PDL spans 2-30 but works only once the
    producer is done; a later kernel overlaps the GEMV's tail; a gap; a lone kernel. The shares
    add up to the busy time (10 + 20 + 5 + 4 = 39)."""
    own = bench_decode.own_time([(0.0, 10.0), (2.0, 30.0), (25.0, 35.0), (40.0, 44.0)])
    assert own == [10.0, 20.0, 5.0, 4.0]
    assert bench_decode.own_time([]) == []


def test_kernels_are_read_from_the_chrome_trace_with_their_grids() -> None:
    """Kernel events of a torch-profiler Chrome trace (CPU ops and runtime calls are not
    kernels); two launches of one GEMV on different shapes stay apart by their grids, and the
    busy time is the union of the intervals."""
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 1, "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "void pq2_gemv_int8_kernel<8>(Params)", "ts": 10,
         "dur": 8, "args": {"grid": [132, 1, 1], "block": [128, 1, 1]}},
        {"ph": "X", "cat": "kernel", "name": "_act_kernel", "ts": 12, "dur": 10,
         "args": {"grid": [1, 5, 1]}},
        {"ph": "X", "cat": "kernel", "name": "void pq2_gemv_int8_kernel<8>(Params)", "ts": 30,
         "dur": 90, "args": {"grid": [1056, 1, 1]}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 200, "dur": 2}]}
    recs = bench_decode.kernel_records(trace)
    assert [(r[0][:12], r[3]) for r in recs] == [("void pq2_gem", "132,1,1"),
                                                 ("_act_kernel", "1,5,1"),
                                                 ("void pq2_gem", "1056,1,1"),
                                                 ("Memcpy DtoD", "")]
    busy, fams, n, names = bench_decode.summarize_kernels(recs)
    assert busy == 12 + 90 + 2 and n == 4  # 10-22, 30-120, 200-202
    assert names["pq2_gemv_int8_kernel [132,1,1]"] == (8.0, 1, 8.0)
    assert names["_act_kernel [1,5,1]"] == (10.0, 1, 4.0)  # its first 6 us are the GEMV's
    assert names["pq2_gemv_int8_kernel [1056,1,1]"] == (90.0, 1, 90.0)
    assert names["Memcpy DtoD"] == (2.0, 1, 2.0)
    assert fams["pq2_linear"] == 108.0


def test_kernel_names_lose_their_template_and_parameter_lists() -> None:
    name = ("void vllm_prism::(anonymous namespace)::pq2_gemv_int8_kernel<8, 5, 1, false, 1>"
            "(vllm_prism::Pq2LinearParams)")
    assert (bench_decode.short_kernel_name(name)
            == "vllm_prism::pq2_gemv_int8_kernel")
    assert bench_decode.short_kernel_name("triton_poi_fused_add_0") == "triton_poi_fused_add_0"
    assert len(bench_decode.short_kernel_name("k" * 200)) == 80


def test_plain_engines_keep_vllms_graph_sizes() -> None:
    """Plain engines take max_num_seqs 256 or more (CUDA graphs up to 512 tokens, so a
    512-token prefill replays graphs as a user's does), more only for larger batches; the
    DFlash engines take their one request."""
    kids = _children(["m.gguf", "--kv", "auto", "--spec-k", "5", "--batches", "1", "8"])
    assert [bench_decode._max_num_seqs(a) for a, _ in kids] == [256, 1]
    big = _children(["m.gguf", "--kv", "auto", "--batches", "1", "512"])[0][0]
    assert bench_decode._max_num_seqs(big) == 512


def test_host_profile_is_the_profiled_time_per_step() -> None:
    """Per profiled step, the host functions' own and cumulative time, ranked by cumulative
    and by own time."""
    times = {"core.py:step": (0.020, 0.400), "runner.py:prepare": (0.080, 0.100),
             "llm.py:generate": (0.0, 0.500), "sampler.py:sample": (0.040, 0.040)}
    out = bench_decode.host_profile(times, steps=4)
    assert out["host_ms_per_step"] == 35.0  # (20 + 80 + 0 + 40) ms / 4
    assert out["host_profiled_steps"] == 4
    assert [t["function"] for t in out["host_top_cumulative"]][:2] == ["llm.py:generate",
                                                                       "core.py:step"]
    assert out["host_top_cumulative"][0]["cum_ms"] == 125.0
    assert out["host_top_own"][0] == {"function": "runner.py:prepare", "own_ms": 20.0,
                                      "cum_ms": 25.0}


def test_step_watch_profiles_the_decode_steps_only() -> None:
    """The watch runs the profiler only from the dispatch of a uniform step of its query
    length until another kind of step (a prefill chunk) comes: work done between a
    prefill's dispatch and the next decode step is not in the profile."""
    import cProfile
    import pstats

    def busy(seconds: float) -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:
            pass

    def prefill_work() -> None:
        busy(0.05)

    def decode_work() -> None:
        busy(0.01)

    prof = cProfile.Profile()
    watch = bench_decode.StepWatch()
    watch.reset(6, prof)
    script = [([8192, 0, "PIECEWISE"], prefill_work), ([6, 6, "FULL"], decode_work),
              ([6, 6, "FULL"], decode_work), ([4096, 0, "NONE"], prefill_work),
              ([6, 6, "FULL"], decode_work), ([5, 0, "PIECEWISE"], prefill_work)]
    for entry, work in script:
        watch(entry)
        work()
    watch.stop()
    assert watch.profiled == 3
    times = bench_decode.function_times(pstats.Stats(prof).stats)
    assert not any(k.endswith(":prefill_work") for k in times)
    assert times[next(k for k in times if k.endswith(":decode_work"))][1] >= 0.03


@pytest.mark.parametrize("engine_process", ["0", "1"])
def test_graph_modes_count_the_steps_since_the_mark(monkeypatch, engine_process: str) -> None:
    """The benchmark installs the step recorder once through collective_rpc (with the
    profiler's watch only where the engine core runs in its process), and a record's
    graph_modes count the uniform steps of its query length dispatched since its mark; the
    drafter's dispatches are counted apart."""
    from types import SimpleNamespace

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", engine_process)
    monkeypatch.setattr(bench_decode, "_RECORDING", None)
    mode = lambda name: SimpleNamespace(name=name)  # noqa: E731
    manager = lambda full: SimpleNamespace(dispatch=lambda reqs, n, u, *a, **kw: SimpleNamespace(  # noqa: E731
        cg_mode=mode("FULL" if u and full else "NONE")))
    runner = SimpleNamespace(cudagraph_manager=manager(True),
                             speculator=SimpleNamespace(query_cudagraph_manager=manager(False)))
    worker = SimpleNamespace(model_runner=runner)
    installs = []

    def collective_rpc(fn, args=()):
        if fn.__name__ == "install":
            installs.append(args)
        return [fn(worker, *args)]

    llm = SimpleNamespace(collective_rpc=collective_rpc)
    runner.cudagraph_manager.dispatch(1, 8192, None)  # a prefill chunk before the mark
    mark = bench_decode._steps_mark(llm)
    assert mark == (0, 0) and len(installs) == 1
    assert installs[0] == (() if engine_process == "1" else (bench_decode._WATCH,))
    for n, u in [(8192, None), (6, 6), (6, 6), (12, 6), (4, None)]:
        runner.cudagraph_manager.dispatch(1, n, u)
    runner.speculator.query_cudagraph_manager.dispatch(1, 6, 6)
    assert bench_decode._modes_since(llm, mark, 6, draft=True) == {
        "graph_modes": {"FULL": 3}, "draft_graph_modes": {"NONE": 1}}
    mark = bench_decode._steps_mark(llm)
    assert mark == (5, 1) and len(installs) == 1
    runner.cudagraph_manager.dispatch(1, 1, 1)
    assert bench_decode._modes_since(llm, mark, 1, draft=False) == {"graph_modes": {"FULL": 1}}


def test_host_profile_divides_by_the_decode_steps_it_profiled(monkeypatch) -> None:
    """_host_profile installs the recorder with the watch, and its per-step figures divide by
    the decode steps the watch covered in the call (not by steps the watch saw after)."""
    from types import SimpleNamespace

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setattr(bench_decode, "_RECORDING", None)
    desc = SimpleNamespace(cg_mode=SimpleNamespace(name="FULL"))
    runner = SimpleNamespace(cudagraph_manager=SimpleNamespace(
        dispatch=lambda reqs, n, u, *a, **kw: desc))
    worker = SimpleNamespace(model_runner=runner)
    llm = SimpleNamespace(collective_rpc=lambda fn, args=(): [fn(worker, *args)])

    def generate(llm, prompts, n):  # a prefill chunk, then n - 1 verification steps
        runner.cudagraph_manager.dispatch(1, 8192, None)
        for _ in range(n - 1):
            runner.cudagraph_manager.dispatch(1, 6, 6)
            time.sleep(0.002)

    monkeypatch.setattr(bench_decode, "_generate", generate)
    out = bench_decode._host_profile(llm, None, 4, 6)
    assert out["host_profiled_steps"] == 4
    assert not bench_decode._WATCH.on and bench_decode._WATCH.profiler is None


def test_a_recorder_that_cannot_install_costs_only_its_fields(monkeypatch, capsys) -> None:
    """Where collective_rpc cannot take the recorder (e.g. pickling refused), the run goes on:
    one warning line, no mark, records without graph_modes, no host profile."""
    from types import SimpleNamespace

    monkeypatch.setattr(bench_decode, "_RECORDING", None)

    def refuse(fn, args=()):
        raise TypeError("not serializable")

    llm = SimpleNamespace(collective_rpc=refuse)
    assert bench_decode._steps_mark(llm) is None
    assert bench_decode._steps_mark(llm) is None  # tried once
    assert "no CUDA-graph record" in capsys.readouterr().out
    assert bench_decode._modes_since(llm, None, 6, draft=True) == {}


def test_step_record_wraps_both_model_runners_dispatch() -> None:
    """vllm_prism/engine/step_record.py records [num_tokens, uniform, mode] of every dispatch
    of vLLM's V1 (dispatcher: mode, descriptor) and V2 (manager: descriptor) runners, passes
    the choice through unchanged and calls on_step with each entry."""
    from types import SimpleNamespace

    from vllm_prism.engine import step_record

    mode = lambda name: SimpleNamespace(name=name)  # noqa: E731
    v1 = SimpleNamespace(cudagraph_dispatcher=SimpleNamespace(
        dispatch=lambda n, uniform=False, **kw: (mode("FULL" if uniform else "PIECEWISE"),
                                                 ("desc", n))))
    seen = []
    step_record.install(SimpleNamespace(model_runner=v1), seen.append)
    assert v1.cudagraph_dispatcher.dispatch(6, True) == (mode("FULL"), ("desc", 6))
    v1.cudagraph_dispatcher.dispatch(100, False)
    assert step_record.read(SimpleNamespace(model_runner=v1)) == [[6, True, "FULL"],
                                                                  [100, False, "PIECEWISE"]]
    assert seen == [[6, True, "FULL"], [100, False, "PIECEWISE"]]

    assert step_record.read_draft(SimpleNamespace(model_runner=v1)) == []

    desc = lambda n, u: SimpleNamespace(cg_mode=mode("FULL" if u else "NONE"), n=n)  # noqa: E731
    manager = lambda: SimpleNamespace(dispatch=lambda reqs, n, u, *a, **kw: desc(n, u))  # noqa: E731
    v2 = SimpleNamespace(cudagraph_manager=manager(),
                         speculator=SimpleNamespace(query_cudagraph_manager=manager()))
    drafts = []
    step_record.install(SimpleNamespace(model_runner=v2), on_draft_step=drafts.append)
    assert v2.cudagraph_manager.dispatch(1, 6, 6, 0).n == 6
    v2.cudagraph_manager.dispatch(1, 8192, None, 0)
    v2.speculator.query_cudagraph_manager.dispatch(1, 6, uniform_token_count=None)
    entries = step_record.read(SimpleNamespace(model_runner=v2))
    assert entries == [[6, 6, "FULL"], [8192, 0, "NONE"]]
    assert step_record.read_draft(SimpleNamespace(model_runner=v2)) == [[6, 0, "NONE"]]
    assert drafts == [[6, 0, "NONE"]]
    assert [step_record.is_uniform(e, 6) for e in entries] == [True, False]
    assert step_record.is_uniform([6, True, "FULL"], 6)
    assert not step_record.is_uniform([6, 1, "FULL"], 6)


def test_host_fingerprint_names_the_cpu_and_times_python() -> None:
    out = bench_decode.host_fingerprint()
    assert out["host_cpus"] == os.cpu_count()
    assert out["host_cpu"] and out["host_py_ms"] > 0


def test_function_times_read_a_cprofile_table() -> None:
    """function_times reads a real cProfile table: a function's own and cumulative time, its
    callee's time inside its cumulative time only."""
    import cProfile
    import pstats

    def inner() -> float:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.03:
            pass
        return t

    def outer() -> float:
        return inner()

    prof = cProfile.Profile()
    prof.enable()
    outer()
    prof.disable()
    times = bench_decode.function_times(pstats.Stats(prof).stats)
    own_in, cum_in = times["test_bench_decode_runs.py:inner"]
    own_out, cum_out = times["test_bench_decode_runs.py:outer"]
    assert cum_in >= 0.025 and cum_out >= cum_in and own_out < 0.01


def test_a_switch_exported_in_the_environment_is_the_default(monkeypatch) -> None:
    """``VLLM_PRISM_DENSE_GEMV=triton bench_decode ...`` runs every engine with it (its option
    named no value); ``--dense-gemv`` on the command line still wins; the int option --pdl
    takes its value as a number; a value the option refuses stops the run naming the
    variable."""
    monkeypatch.setenv("VLLM_PRISM_DENSE_GEMV", "triton")
    monkeypatch.setenv("VLLM_PRISM_PDL", "0")
    kids = _children(["m.gguf", "--kv", "auto", "int8_per_token_head"])
    assert [(env["VLLM_PRISM_DENSE_GEMV"], env["VLLM_PRISM_PDL"]) for _, env in kids] == [
        ("triton", "0"), ("triton", "0")]
    kids = _children(["m.gguf", "--kv", "auto", "--dense-gemv", "auto", "torch"])
    assert [env["VLLM_PRISM_DENSE_GEMV"] for _, env in kids] == ["auto", "torch"]
    monkeypatch.setenv("VLLM_PRISM_DENSE_GEMV", "fast")
    with pytest.raises(SystemExit, match="VLLM_PRISM_DENSE_GEMV='fast' in the environment"):
        bench_decode.build_parser()


class _Metrics:
    def __init__(self, first: float, last: float) -> None:
        self.first_token_ts, self.last_token_ts = first, last


class _Out:
    def __init__(self, first: float, last: float) -> None:
        self.metrics = _Metrics(first, last)


def test_a_batch_decodes_together_through_the_last_requests_window(monkeypatch) -> None:
    """The decode step of a batch: the requests admitted before the last generate the steps
    of their head start more (the prompts prefilled after theirs, 8192 tokens a step, and 4),
    so that the whole batch decodes through the last request's window; the step is that
    window over T, and ``full_batch_frac`` says how much of the window had the whole batch
    (less when the others ended first, as when the KV cache holds fewer requests)."""
    assert bench_decode.head_start_steps(1, 32768) == 0
    assert bench_decode.head_start_steps(8, 32768) == 7 * 4 + 4
    assert bench_decode.head_start_steps(8, 1000) == 1 + 4
    calls = []

    def fake_generate(llm, prompts, counts):
        calls.append(counts)
        # request 0 decodes 0.0 .. 3.0 s, the last one 1.0 .. 2.0: together throughout
        return 0.0, [_Out(0.0, 3.0), _Out(0.5, 2.5), _Out(1.0, 2.0)]
    monkeypatch.setattr(bench_decode, "_generate", fake_generate)
    step, frac = bench_decode._decode_step_s(None, [[1], [2], [3]], 10, reps=1, context=8192)
    assert calls == [[1 + 10 + 6, 1 + 10 + 6, 1 + 10]]  # 2 prompts of 8192 + 4
    assert step == 0.1 and frac == 1.0
    # the first request ended a quarter into the last one's window
    metrics = [_Metrics(0.0, 1.25), _Metrics(0.5, 2.5), _Metrics(1.0, 2.0)]
    assert bench_decode.full_batch_fraction(metrics) == 0.25
    # it ended before the last one started (the cache held two of three)
    assert bench_decode.full_batch_fraction([_Metrics(0.0, 0.9), _Metrics(1.0, 2.0)]) == 0.0


def test_rounds_alternate_the_measuring_order_and_keep_the_median() -> None:
    """``--rounds``: engine i of N measures i-th in even rounds and (N-1-i)-th in odd ones, so
    the first turn after the warm-ups is not always the same engine's; each record is the
    round of median step time (the lower middle of two), with every round's time; each child
    gets its index."""
    assert [bench_decode.turn_slot(i, 3, 0) for i in range(3)] == [0, 1, 2]
    assert [bench_decode.turn_slot(i, 3, 1) for i in range(3)] == [2, 1, 0]
    rounds = [[{"kind": "verify", "ms_per_step": 9.0, "tag": 0},
               {"kind": "decode", "ms_per_step": 5.0, "tag": 0}],
              [{"kind": "verify", "ms_per_step": 8.0, "tag": 1},
               {"kind": "decode", "ms_per_step": 5.5, "tag": 1}],
              [{"kind": "verify", "ms_per_step": 8.5, "tag": 2},
               {"kind": "decode", "ms_per_step": 5.2, "tag": 2}]]
    out = bench_decode.median_round(rounds)
    assert [(r["tag"], r["rounds_ms"]) for r in out] == [(2, [9.0, 8.0, 8.5]),
                                                         (2, [5.0, 5.5, 5.2])]
    assert bench_decode.median_round(rounds[:2])[0]["tag"] == 1  # 8.0 of (9.0, 8.0)
    rounds[0][0]["kernel_us_per_step"] = {"pq2_linear": 1.0}  # the first round's profile
    assert bench_decode.median_round(rounds)[0]["kernel_us_per_step"] == {"pq2_linear": 1.0}
    assert bench_decode.median_round(rounds[:1]) == rounds[0]  # one round: unchanged
    kids = _children(["m.gguf", "--kv", "auto", "--side-by-side", "--pq2-kernel", "auto",
                      "mma_lean_cuda,auto",
                      "--rounds", "2"], lock="/tmp/turn")
    assert [(a.engine_index, a.engines, a.rounds) for a, _ in kids] == [(0, 2, 2), (1, 2, 2)]


def test_turns_wait_for_the_slots_before_and_a_failed_engine_takes_its_turns(tmp_path) -> None:
    """An engine waits for the turns before its slot (lines of the turns file); a child that
    dies counts as having taken its turns, so the others do not wait out the timeout."""
    lock = str(tmp_path / "turn")
    t0 = time.monotonic()
    bench_decode._wait_turn(lock, 0, timeout_s=30.0)  # the first slot: at once
    assert time.monotonic() - t0 < 5
    t0 = time.monotonic()
    bench_decode._wait_turn(lock, 1, timeout_s=1.0)  # nobody took a turn: the timeout
    assert time.monotonic() - t0 >= 1.0
    code, _ = bench_decode._run_child([sys.executable, "-c", "raise SystemExit(3)"],
                                      dict(os.environ), "dies", lock, rounds=2)
    assert code == 3
    t0 = time.monotonic()
    bench_decode._wait_turn(lock, 2, timeout_s=30.0)
    assert time.monotonic() - t0 < 5


def test_two_engines_measure_in_turn_order_then_reversed(monkeypatch, tmp_path) -> None:
    """Two side-by-side engines of a ``--rounds 2`` run (threads here): engine 0 measures
    first in round 0 and engine 1 first in round 1, never both at once, and each returns its
    rounds' median records."""
    import argparse
    import threading

    lock = str(tmp_path / "turn")
    order, busy = [], []

    def fake_measure(llm, args):
        busy.append(args.engine_index)
        assert len(busy) == 1, busy  # the turn lock: one engine measures at a time
        order.append(args.engine_index)
        time.sleep(0.2)
        busy.pop()
        return [{"kind": "decode", "ms_per_step": 5.0 + len(order), "engine": args.engine_index}]
    monkeypatch.setattr(bench_decode, "_measure", fake_measure)
    results = {}

    def engine(index: int) -> None:
        args = argparse.Namespace(rounds=2, turn_lock=lock, engines=2, engine_index=index,
                                  profile=True, host_profile=False)
        if index == 0:
            time.sleep(0.3)  # engine 1 is ready first, yet waits for its slot
        results[index] = bench_decode.measure_rounds(None, args)
    threads = [threading.Thread(target=engine, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert order == [0, 1, 1, 0]
    assert results[0][0]["rounds_ms"] == [6.0, 9.0] and results[1][0]["rounds_ms"] == [7.0, 8.0]


def test_results_page_names_every_unreliable_note(tmp_path) -> None:
    """Records marked ``unreliable`` for different reasons: the results page marks each row
    and gives every distinct reason once."""
    base = {"kind": "decode", "batch": 1, "context": 32768, "mode": "default", "kv": "k",
            "tp": 1, "pdl": 1, "attn_kernel": "auto", "ms_per_step": 5.0, "tok_s": 200.0}
    records = [{**base, "pq2_kernel": "a", "unreliable": "reason one"},
               {**base, "pq2_kernel": "b", "unreliable": "reason two"},
               {**base, "pq2_kernel": "c", "unreliable": "reason two"},
               {**base, "pq2_kernel": "d"}]
    bench_decode.write_results(tmp_path, "gpu", "cmd", 4000.0, records)
    page = (tmp_path / "e2e_gpu.md").read_text()
    assert page.count("reason one") == 1 and page.count("reason two") == 1
    assert page.count("200.0 *") == 3 and page.count("| 200.0 |") == 1


def test_default_drafter_has_the_bonsai_drafters_kv_shape(monkeypatch) -> None:
    """Without --drafter the tiny drafter gets the Bonsai 2 drafter's layer count and sliding
    window (spec section 5): they decide vLLM's KV-cache groups, and a one-layer drafter
    split the 27B-shaped target into 65 groups (e2e_h100-80gb-hbm3.md)."""
    args = bench_decode.build_parser().parse_args(["m.gguf", "--kv", "auto", "--spec-k", "5"])
    assert (args.drafter_layers, args.drafter_window) == (5, 2048)
    seen = {}

    def fake(out_dir, target, *, layers, sliding_window):
        seen.update(target=target, layers=layers, window=sliding_window)
        return {"path": str(out_dir)}

    import vllm_prism.spec_decode.tiny_drafter as tiny
    monkeypatch.setattr(tiny, "make_tiny_drafter", fake)
    bench_decode._tiny_drafter("m.gguf", 5, 2048)
    assert seen == {"target": "m.gguf", "layers": 5, "window": 2048}
    bench_decode._tiny_drafter("m.gguf", 1, 0)
    assert seen["window"] is None  # 0: full attention


def test_drafter_shape_is_read_from_its_config(tiny_gguf, tmp_path) -> None:
    from vllm_prism.spec_decode.tiny_drafter import make_tiny_drafter

    target = tiny_gguf()
    swa = make_tiny_drafter(tmp_path / "a", target, layers=5, sliding_window=2048)["path"]
    full = make_tiny_drafter(tmp_path / "b", target)["path"]
    assert bench_decode._drafter_shape(swa) == "5 layers, window 2048"
    assert bench_decode._drafter_shape(full) == "1 layer, full attention"
    # a drafter whose layer_types mix sliding-window and full-attention layers
    config = json.loads((Path(swa) / "config.json").read_text())
    config["layer_types"] = ["sliding_attention"] * 4 + ["full_attention"]
    (Path(swa) / "config.json").write_text(json.dumps(config))
    assert bench_decode._drafter_shape(swa) == "5 layers: 4 window 2048, 1 full attention"


def test_kv_cache_groups_are_the_runners_group_sizes() -> None:
    import types

    groups = [types.SimpleNamespace(layer_names=["a", "b"]),
              types.SimpleNamespace(layer_names=["c"])]
    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
        kv_cache_config=types.SimpleNamespace(kv_cache_groups=groups)))
    assert bench_decode.step_record.kv_cache_groups(worker) == [2, 1]


def test_verify_records_of_two_drafters_are_kept_apart(tmp_path) -> None:
    """Two verification records that differ only in the drafter both stay in the results
    (the merge key holds the drafter), each row naming it, with its KV-cache groups."""
    base = {"kind": "verify", "batch": 1, "context": 32768, "q_tokens": 6, "mode": "default",
            "kv": "k", "tp": 1, "pdl": 1, "attn_kernel": "auto", "pq2_kernel": "auto",
            "tok_s": 100.0}
    records = [{**base, "drafter": "1 layer, full attention", "ms_per_step": 10.5,
                "kv_cache_groups": [1] * 65},
               {**base, "drafter": "5 layers, window 2048", "ms_per_step": 9.3,
                "kv_cache_groups": [5] * 15}]
    bench_decode.write_results(tmp_path, "gpu", "cmd", 4000.0, records[:1])
    bench_decode.write_results(tmp_path, "gpu", "cmd", 4000.0, records[1:])
    page = (tmp_path / "e2e_gpu.md").read_text()
    assert "verify (drafter 1 layer, full attention)" in page
    assert "verify (drafter 5 layers, window 2048)" in page
    assert "65 KV-cache groups, at most 1 layers each" in page
    assert "15 KV-cache groups, at most 5 layers each" in page


def test_records_carry_their_switches_and_replace_only_the_same(tmp_path) -> None:
    """A record keeps the explicit value of every engine switch it ran with, and a new run
    replaces an earlier record only where both ran with the same values: a run with every
    default once replaced a record of VLLM_PRISM_ATTN_VERIFY_FORM=mma written when mma was
    the default (both unlabelled). Records written before the switches were kept stay."""
    env = {name: "" for _, name, _ in bench_decode.ENGINE_SWITCHES}
    mma = bench_decode.engine_switches({**env, "VLLM_PRISM_ATTN_VERIFY_FORM": "mma"})
    auto = bench_decode.engine_switches({**env, "VLLM_PRISM_ATTN_VERIFY_FORM": "auto"})
    assert mma["VLLM_PRISM_ATTN_VERIFY_FORM"] == "mma" and set(mma) == set(env)
    base = {"kind": "verify", "batch": 1, "context": 32768, "q_tokens": 6, "mode": "default",
            "kv": "k", "tp": 1, "pdl": 1, "attn_kernel": "auto", "pq2_kernel": "auto",
            "tok_s": 100.0, "drafter": "5 layers, window 2048"}
    legacy = {**base, "ms_per_step": 9.29, "date": "2026-12-05"}
    bench_decode.write_results(tmp_path, "gpu", "cmd", 4000.0, [legacy])
    bench_decode.write_results(tmp_path, "gpu", "cmd", 4000.0,
                               [{**base, "ms_per_step": 9.30, "switches": mma}])
    bench_decode.write_results(tmp_path, "gpu", "cmd", 4000.0,
                               [{**base, "ms_per_step": 9.36, "switches": auto}])
    bench_decode.write_results(tmp_path, "gpu", "cmd", 4000.0,
                               [{**base, "ms_per_step": 9.40, "switches": auto}])
    kept = json.loads((tmp_path / "e2e_gpu.json").read_text())["records"]
    assert sorted(r["ms_per_step"] for r in kept) == [9.29, 9.30, 9.40]
    page = (tmp_path / "e2e_gpu.md").read_text()
    assert "| 9.29 |" in page and "| 2026-12-05 |" in page and "| 9.36 |" not in page


def test_engine_log_echo_keeps_the_served_verification_form() -> None:
    """The child-output filter echoes the line that names the INT8 verification form an
    engine served (it once dropped it, so a 27B-shaped run could not tell which form ran),
    with and without the fallback reason, and still drops ordinary lines."""
    line = ("(EngineCore pid=1) INFO [cuda_decode.py:331] vllm-prism: the INT8 verification "
            "attention runs the {} form (VLLM_PRISM_ATTN_VERIFY_FORM=auto{})")
    assert bench_decode.STARTUP_LINE.search(line.format("wgmma_tma", ""))
    assert bench_decode.STARTUP_LINE.search(line.format("mma", ": no warpgroup-MMA form"))
    assert not bench_decode.STARTUP_LINE.search("INFO [core.py:1] engine step 12 done")
