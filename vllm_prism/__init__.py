"""vllm-prism: serve PrismML's ternary Bonsai GGUF models with stock vLLM.

vLLM calls :func:`register` (our one ``vllm.general_plugins`` entry point) in every process
it starts. Importing this package is cheap and needs no GPU: everything heavy is imported
inside ``register``.
"""

from __future__ import annotations

import logging
import threading

__version__ = "0.1.0"

_registered = False
_lock = threading.Lock()


def register() -> None:
    """Register vllm-prism's components with vLLM. Idempotent; safe in every process."""
    global _registered
    with _lock:
        if _registered:
            return
        from vllm_prism._registry import register_all

        register_all()
        _registered = True
        logging.getLogger(__name__).debug("vllm-prism %s registered", __version__)


def is_registered() -> bool:
    """Whether :func:`register` has run in this process."""
    return _registered
