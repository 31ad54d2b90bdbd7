"""Record vLLM's CUDA-graph dispatch of every model step, for tests and benchmarks.

:func:`install` wraps the model runner's dispatch of an engine whose worker runs in this
process (``llm.collective_rpc(install)`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so each
step appends ``[num_tokens, uniform, runtime mode]`` to the runner's record (:func:`read`):
``uniform`` is vLLM's uniform-decode flag under model runner V1 and the step's uniform query
length under V2 (the GPU default; 0 when the step has none), the mode a ``CUDAGraphMode`` name
("FULL", "PIECEWISE", "NONE"). ``on_step`` is called with each entry as the step dispatches,
before its forward (bench_decode.py uses it to profile the host's decode steps only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

StepEntry = list  # [num_tokens, uniform (bool under V1, int under V2), mode name]


def install(worker: Any, on_step: Callable[[StepEntry], None] | None = None) -> None:
    """Wrap ``worker.model_runner``'s CUDA-graph dispatch (see the module docstring)."""
    runner = worker.model_runner
    record: list[StepEntry] = []

    def note(entry: StepEntry) -> None:
        record.append(entry)
        if on_step is not None:
            on_step(entry)

    if hasattr(runner, "cudagraph_dispatcher"):  # V1
        owner = runner.cudagraph_dispatcher
        inner = owner.dispatch

        def dispatch(num_tokens, uniform_decode=False, *args, **kwargs):
            mode, desc = inner(num_tokens, uniform_decode, *args, **kwargs)
            note([num_tokens, bool(uniform_decode), mode.name])
            return mode, desc
    else:  # V2: the graph manager picks a BatchExecutionDescriptor
        owner = runner.cudagraph_manager
        inner = owner.dispatch

        def dispatch(num_reqs, num_tokens, uniform_token_count, *args, **kwargs):
            desc = inner(num_reqs, num_tokens, uniform_token_count, *args, **kwargs)
            note([num_tokens, int(uniform_token_count or 0), desc.cg_mode.name])
            return desc
    owner.dispatch = dispatch
    runner.prism_record = record


def read(worker: Any) -> list[StepEntry]:
    """The entries :func:`install` recorded in ``worker``'s model runner so far."""
    return list(worker.model_runner.prism_record)


def is_uniform(entry: StepEntry, query_len: int) -> bool:
    """Whether a recorded step is a uniform batch of ``query_len`` tokens a request (a
    verification step at ``query_len = k + 1``, a plain decode step at 1)."""
    num_tokens, uniform = entry[0], entry[1]
    if isinstance(uniform, bool):  # V1 records only the flag
        return uniform and num_tokens % query_len == 0
    return uniform == query_len and num_tokens % query_len == 0
