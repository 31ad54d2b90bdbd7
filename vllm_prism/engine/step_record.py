"""Record vLLM's CUDA-graph dispatch of every model step, for tests and benchmarks.

:func:`install` wraps the model runner's dispatch of an engine whose worker runs in this
process (``llm.collective_rpc(install)`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so each
step appends ``[num_tokens, uniform, runtime mode]`` to the runner's record (:func:`read`):
``uniform`` is vLLM's uniform-decode flag under model runner V1 and the step's uniform query
length under V2 (the GPU default; 0 when the step has none), the mode a ``CUDAGraphMode`` name
("FULL", "PIECEWISE", "NONE"). ``on_step`` is called with each entry as the step dispatches,
before its forward (bench_decode.py uses it to profile the host's decode steps only). A step
that vLLM runs eagerly without asking the dispatch (its profiling run) is not recorded.

Under model runner V2 a drafter with its own graph manager (DFlash's
``speculator.query_cudagraph_manager``) is recorded the same way into
:func:`read_draft`, with ``on_draft_step``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

StepEntry = list  # [num_tokens, uniform (bool under V1, int under V2), mode name]


def _recorder(record: list[StepEntry],
              on_step: Callable[[StepEntry], None] | None) -> Callable[[StepEntry], None]:
    def note(entry: StepEntry) -> None:
        record.append(entry)
        if on_step is not None:
            on_step(entry)
    return note


def _wrap_v1(owner: Any, note: Callable[[StepEntry], None]) -> None:
    """Record a V1 dispatcher's dispatch (it returns the mode and a descriptor)."""
    inner = owner.dispatch

    def dispatch(num_tokens, uniform_decode=False, *args, **kwargs):
        mode, desc = inner(num_tokens, uniform_decode, *args, **kwargs)
        note([num_tokens, bool(uniform_decode), mode.name])
        return mode, desc
    owner.dispatch = dispatch


def _wrap_v2(owner: Any, note: Callable[[StepEntry], None]) -> None:
    """Record a V2 graph manager's dispatch (it picks a BatchExecutionDescriptor)."""
    inner = owner.dispatch

    def dispatch(num_reqs, num_tokens, uniform_token_count, *args, **kwargs):
        desc = inner(num_reqs, num_tokens, uniform_token_count, *args, **kwargs)
        note([num_tokens, int(uniform_token_count or 0), desc.cg_mode.name])
        return desc
    owner.dispatch = dispatch


def install(worker: Any, on_step: Callable[[StepEntry], None] | None = None,
            on_draft_step: Callable[[StepEntry], None] | None = None) -> None:
    """Wrap ``worker.model_runner``'s CUDA-graph dispatch, and its drafter's where it has its
    own (see the module docstring)."""
    runner = worker.model_runner
    runner.prism_record, runner.prism_draft_record = [], []
    note = _recorder(runner.prism_record, on_step)
    if hasattr(runner, "cudagraph_dispatcher"):  # V1
        _wrap_v1(runner.cudagraph_dispatcher, note)
    else:
        _wrap_v2(runner.cudagraph_manager, note)
    drafter = getattr(getattr(runner, "speculator", None), "query_cudagraph_manager", None)
    if drafter is not None:
        _wrap_v2(drafter, _recorder(runner.prism_draft_record, on_draft_step))


def read(worker: Any, start: int = 0) -> list[StepEntry]:
    """The entries :func:`install` recorded in ``worker``'s model runner, from ``start``."""
    return worker.model_runner.prism_record[start:]


def read_draft(worker: Any, start: int = 0) -> list[StepEntry]:
    """The drafter's entries from ``start`` (none where it has no graph manager of its
    own)."""
    return worker.model_runner.prism_draft_record[start:]


def counts(worker: Any) -> tuple[int, int]:
    """How many target and drafter entries are recorded so far (a mark for :func:`read`
    and :func:`read_draft`)."""
    runner = worker.model_runner
    return len(runner.prism_record), len(runner.prism_draft_record)


def is_uniform(entry: StepEntry, query_len: int) -> bool:
    """Whether a recorded step is a uniform batch of ``query_len`` tokens a request (a
    verification step at ``query_len = k + 1``, a plain decode step at 1)."""
    num_tokens, uniform = entry[0], entry[1]
    if isinstance(uniform, bool):  # V1 records only the flag
        return uniform and num_tokens % query_len == 0
    return uniform == query_len and num_tokens % query_len == 0


def kv_cache_groups(worker: Any) -> list[int]:
    """The layer count of each KV-cache group of ``worker``'s model runner (one metadata
    build a group every step: the host's cost of a step grows with their number)."""
    config = worker.model_runner.kv_cache_config
    return [len(group.layer_names) for group in config.kv_cache_groups]
