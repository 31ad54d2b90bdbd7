"""What :func:`vllm_prism.register` registers with vLLM, in one place.

Each entry is a small function that imports its component lazily and registers it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

SUPPORTED_VLLM_VERSIONS = ("0.32.0",)


def _check_vllm_version() -> None:
    import vllm

    version = getattr(vllm, "__version__", "unknown")
    if not any(version.startswith(v) for v in SUPPORTED_VLLM_VERSIONS):
        logger.warning(
            "vllm-prism was built and tested for vLLM %s; this is vLLM %s",
            ", ".join(SUPPORTED_VLLM_VERSIONS), version)


def _attach_vllm_logging() -> None:
    """Put the ``vllm_prism`` loggers under vLLM's ``vllm`` logger: vLLM configures only that
    one (handlers, level, no propagation), and does it after plugins load, so our records
    reach its handlers by propagation and our level follows its level."""
    logging.getLogger("vllm_prism").parent = logging.getLogger("vllm")


def _register_serving() -> None:
    """The prism quantization method, the GGUF config source and loader, the model class,
    the PRISM attention backend and the engine-argument hook that selects them for a .gguf
    model."""
    from vllm import ModelRegistry

    import vllm_prism.model_executor.layers.quantization.prism  # noqa: F401 (registers)
    from vllm_prism.attention.backends.prism_attn import register_attention_backend
    from vllm_prism.engine.arg_utils import install_engine_args_hook
    from vllm_prism.model_executor.model_loader.gguf_loader import register_gguf_loader
    from vllm_prism.transformers_utils.gguf_config import ARCHITECTURE, register_config_source

    register_config_source()
    register_gguf_loader()
    ModelRegistry.register_model(
        ARCHITECTURE, "vllm_prism.model_executor.models.bonsai:PrismBonsaiForCausalLM")
    register_attention_backend()
    install_engine_args_hook()


def _apply_patches() -> None:
    from vllm_prism.patches import apply_patches

    apply_patches()


REGISTRATIONS: list[Callable[[], None]] = [_attach_vllm_logging, _check_vllm_version,
                                           _apply_patches, _register_serving]


def register_all() -> None:
    """Run every registration function once, in order (nothing without vLLM)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        logger.warning("vllm-prism: vLLM is not installed; nothing to register")
        return
    for fn in REGISTRATIONS:
        fn()
