"""What :func:`vllm_prism.register` registers with vLLM, in one place.

Each entry is a small function that imports its component lazily and registers it. The
list grows as components land (quantization method, GGUF loader, model class, attention
backend, patches); today it only checks that the vLLM it runs in is the one we pin.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

SUPPORTED_VLLM_VERSIONS = ("0.32.0",)


def _check_vllm_version() -> None:
    try:
        import vllm
    except ImportError:
        logger.warning("vllm-prism: vLLM is not installed; nothing to register")
        return
    version = getattr(vllm, "__version__", "unknown")
    if not any(version.startswith(v) for v in SUPPORTED_VLLM_VERSIONS):
        logger.warning(
            "vllm-prism was built and tested for vLLM %s; this is vLLM %s",
            ", ".join(SUPPORTED_VLLM_VERSIONS), version)


REGISTRATIONS: list[Callable[[], None]] = [_check_vllm_version]


def register_all() -> None:
    """Run every registration function once, in order."""
    for fn in REGISTRATIONS:
        fn()
