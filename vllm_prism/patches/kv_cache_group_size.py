"""Patch: KV-cache group planning pads the full-attention layers when a drafter is added.

What breaks: a hybrid target with a speculative drafter of another attention type, e.g.
Bonsai 2 27B (48 Gated DeltaNet layers, 16 full-attention layers) with the DFlash2 drafter
(5 sliding-window layers). vLLM 0.32 splits every attention type into groups of the same
number of layers and, for this model, picks 5 layers per group: the 16 full-attention layers
become 4 groups of 5 ("Add 4 padding layers, may waste at most 25.00% KV cache memory"), so
every block of full-attention KV carries 20 pages for 16 layers' worth of data: a fifth of
that memory, the part that grows with the context, is padding.

Why: ``_get_kv_cache_groups_uniform_page_size`` (vllm/v1/core/kv_cache_utils.py) takes the
smallest type's layer count as the group size (the "n:1" heuristic of its FIXME), or the
largest when the two are within 1.5x. A 5-layer drafter next to 16 and 48 layers hits the
first rule. (The model takes this path, not ``_get_packed_kv_cache_groups``: the Triton /
PRISM, Gated DeltaNet and drafter backends declare no KV-cache layout, so vLLM resolves its
default, LBNHC, which is not block-outermost; BF16 and int8_per_token_head caches alike.)

The fix: choose, among the sizes vLLM's heuristic picks from (the layer count of each
attention type), the one whose padding costs the fewest bytes per request at
``max_model_len`` (padded slots x the blocks a request holds in that group, from each
spec's own ``max_memory_usage_bytes``: full attention pays for the whole context, a sliding
window for its window, Mamba for its state), then the fewest groups. For Bonsai 2 with the
drafter at any realistic context that is 16: no full-attention padding, 5 groups, the
drafter's group padded; at a context shorter than the drafter's window plus the scheduler's
in-flight tokens, padding the full-attention groups costs less and vLLM's 5 stands.
``get_kv_cache_groups`` is wrapped too, only to make its ``vllm_config`` available (the
inner function receives the specs alone). The buckets and the final group specs stay
vLLM's own (the patch re-splits the buckets the original returned, as it splits them, and
calls ``create_kv_cache_group_specs``); where vLLM's choice is already the cheapest, its
result is returned untouched (Gemma 3, Llama 4, gpt-oss with Eagle, Qwen3-Next and Qwen3.5
without a drafter: tests/patches/test_kv_cache_group_size.py).

Upstream: vLLM's FIXME(Chen) in ``_get_kv_cache_groups_uniform_page_size``; the discussion
of DFlash on hybrid Qwen3.5 models multiplying the number of KV-cache groups is in
docs/upstream/kv-cache-group-size.md, with how this differs. Remove when vLLM chooses the
group size by padding cost.

Applies to: vLLM 0.32.x. Test: tests/patches/test_kv_cache_group_size.py (fails without
the patch). PR text: docs/upstream/kv-cache-group-size.md.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Sequence
from typing import Any

from vllm_prism.patches import VllmPatch, is_patched, mark_patched

logger = logging.getLogger(__name__)

TARGET = "vllm.v1.core.kv_cache_utils._get_kv_cache_groups_uniform_page_size"
_CONFIG: contextvars.ContextVar[Any] = contextvars.ContextVar("prism_kv_group_config",
                                                              default=None)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def choose_group_size(buckets: Sequence[tuple[int, int]], candidates: Sequence[int]) -> int:
    """The group size for buckets of (layer count, pages a request holds per layer of that
    type): fewest padding pages per request, then fewest groups, then the largest size."""
    def key(g: int) -> tuple[int, int, int]:
        padding = sum((_cdiv(n, g) * g - n) * pages for n, pages in buckets)
        groups = sum(_cdiv(n, g) for n, _ in buckets)
        return padding, groups, -g

    return min(candidates, key=key)


def _pages_per_request(spec: Any, vllm_config: Any) -> int:
    return _cdiv(spec.max_memory_usage_bytes(vllm_config), spec.page_size_bytes)


def _buckets(groups: list[Any]) -> list[list[str]]:
    """The per-type layer lists the original split, in their original order: consecutive
    groups with equal specs come from one bucket, split as ``layers[i::num_groups]``."""
    runs: list[list[Any]] = []
    for group in groups:
        if runs and runs[-1][0].kv_cache_spec == group.kv_cache_spec:
            runs[-1].append(group)
        else:
            runs.append([group])
    buckets = []
    for run in runs:
        k = len(run)
        width = max(len(g.layer_names) for g in run)
        layers = [run[i].layer_names[j] for j in range(width) for i in range(k)
                  if j < len(run[i].layer_names)]
        buckets.append(layers)
    return buckets


class _DropPaddingWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Add %d padding layers")


def _regroup(original: Callable[[dict], list], kv_cache_spec: dict) -> list:
    import vllm.v1.core.kv_cache_utils as kcu

    vllm_config = _CONFIG.get()
    log = logging.getLogger(kcu.__name__)
    quiet = _DropPaddingWarning()
    if vllm_config is not None:
        log.addFilter(quiet)  # its padding warning speaks of the size we may replace
    try:
        groups = original(kv_cache_spec)
    finally:
        log.removeFilter(quiet)
    if not groups or vllm_config is None:
        return groups
    buckets = _buckets(groups)
    costs = [(len(b), _pages_per_request(kv_cache_spec[b[0]], vllm_config)) for b in buckets]
    size = choose_group_size(costs, sorted({n for n, _ in costs}))
    before = max(len(g.layer_names) for g in groups)
    grouped: list[list[str]] = []
    for layers in buckets:
        k = _cdiv(len(layers), size)
        grouped += [layers[i::k] for i in range(k)]
    for (n, _), layers in zip(costs, buckets):
        pad = _cdiv(n, size) * size - n
        if pad:
            logger.info("vllm-prism: KV-cache groups of %d layers: %d padding layer slot(s) "
                        "next to %d %s layers", size, pad, n,
                        type(kv_cache_spec[layers[0]]).__name__)
    if size == before:
        return groups
    logger.info("vllm-prism: KV-cache groups of %d layers instead of %d: %d groups, the "
                "padding costs the fewest bytes per request", size, before, len(grouped))
    return kcu.create_kv_cache_group_specs(kv_cache_spec, grouped)


def apply() -> bool:
    import vllm.v1.core.kv_cache_utils as kcu

    inner = kcu._get_kv_cache_groups_uniform_page_size
    outer = kcu.get_kv_cache_groups
    if is_patched(inner):
        return False

    def uniform_page_size_groups(kv_cache_spec: dict) -> list:
        return _regroup(inner, kv_cache_spec)

    def get_kv_cache_groups(vllm_config: Any, kv_cache_spec: dict) -> list:
        token = _CONFIG.set(vllm_config)
        try:
            return outer(vllm_config, kv_cache_spec)
        finally:
            _CONFIG.reset(token)

    kcu._get_kv_cache_groups_uniform_page_size = mark_patched(uniform_page_size_groups, inner)
    kcu.get_kv_cache_groups = mark_patched(get_kv_cache_groups, outer)
    return True


PATCH = VllmPatch(
    name="kv_cache_group_size",
    target=TARGET,
    vllm_versions=("0.32.*",),
    apply=apply,
    upstream_doc="docs/upstream/kv-cache-group-size.md",
    upstream="FIXME(Chen) in _get_kv_cache_groups_uniform_page_size; related open PRs "
             "vllm#49472 and vllm#51742 (see the PR text); ours not yet filed",
    remove_when="vLLM chooses the hybrid group size by the memory its padding costs",
    test="tests/patches/test_kv_cache_group_size.py",
)
