"""Make vLLM's engine arguments serve a Bonsai GGUF file given as the model.

``LLM("model.gguf")`` and ``vllm serve model.gguf`` build an ``EngineArgs``; before vLLM
turns it into a model config, :func:`prepare_gguf_engine_args` checks the file (every
problem is reported here, before the engine starts) and selects our config source, loader
and quantization method, the PRISM attention backend on CUDA (unless an attention backend
is given), and the tokenizer and chat template stored in the file unless ``--tokenizer`` is
given.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from vllm.logger import init_logger

from vllm_prism import envs
from vllm_prism.transformers_utils.gguf_config import (CONFIG_FORMAT, LOAD_FORMAT,
                                                       QUANTIZATION, is_gguf_model)

logger = init_logger(__name__)

__all__ = ["is_gguf_model", "check_gguf_for_serving", "materialize_tokenizer",
           "prepare_gguf_engine_args", "install_engine_args_hook"]


def check_gguf_for_serving(path: str | os.PathLike, *, own_tokenizer: bool = True) -> Any:
    """Raise ValueError naming the file and every problem that stops it being served
    (``own_tokenizer=False``: the tokenizer is given or skipped, the file needs none);
    return the file's InspectReport otherwise."""
    from vllm_prism.gguf.errors import GGUFError
    from vllm_prism.gguf.inspect import capped, check_serving
    from vllm_prism.gguf.reader import GGUFReader

    if not Path(path).exists():
        raise ValueError(f"{path}: no such GGUF file; check the model path")
    try:
        with GGUFReader(path) as reader:
            # The tokenizer is built (and checked) once, when its folder is written.
            report, problems = check_serving(reader, own_tokenizer=own_tokenizer, build=False)
    except GGUFError as e:
        raise ValueError(f"vllm-prism cannot serve {e}") from None
    for warning in report.warnings:
        logger.warning("vllm-prism: %s: %s", path, warning)
    if problems:
        lines = "\n".join(f"  - {p}" for p in capped(problems))
        raise ValueError(f"vllm-prism cannot serve {path}:\n{lines}\n"
                         f"(`vllm-prism inspect {path}` shows the whole file)")
    return report


def materialize_tokenizer(path: str | os.PathLike) -> str:
    """Write the file's tokenizer and chat template as a Hugging Face tokenizer folder
    (cached by file identity) and return the folder. The folder also holds the model's
    text config (config.json): vLLM reads a config from the tokenizer path, and without one
    logs two errors and sleeps through its retries at every start."""
    from vllm_prism.gguf.reader import GGUFReader
    from vllm_prism.gguf.errors import GGUFError
    from vllm_prism.gguf.tokenizer import build_tokenizer, read_tokenizer_data

    st = os.stat(path)
    key = hashlib.sha256(f"{Path(path).resolve()}:{st.st_size}:{st.st_mtime_ns}:v2".encode()
                         ).hexdigest()[:24]
    out = Path(envs.VLLM_PRISM_CACHE_DIR) / "tokenizers" / key
    if (out / "tokenizer_config.json").is_file():
        return str(out)
    from vllm_prism.gguf.qwen35 import HF_MODEL_TYPE
    from vllm_prism.transformers_utils.gguf_config import text_config_of

    with GGUFReader(path) as reader:
        data = read_tokenizer_data(reader.metadata, reader.path)
        context = reader.metadata.get("qwen35.context_length")
        text_config = {**text_config_of(reader), "model_type": HF_MODEL_TYPE}
    try:
        tok = build_tokenizer(data)
    except GGUFError as e:
        raise ValueError(f"vllm-prism cannot serve {path}:\n  - {e.reason}\n(pass --tokenizer "
                         "with a Hugging Face tokenizer instead)") from None
    special = {k: data.tokens[v] for k, v in data.special_ids.items()}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "add_bos_token": data.add_bos,
        **{f"{k}_token": v for k, v in special.items()},
    }
    if context:
        config["model_max_length"] = int(context)
    if data.chat_template:
        config["chat_template"] = data.chat_template
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tokenizer.json").write_text(tok.to_str())
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (tmp / "config.json").write_text(json.dumps(text_config, indent=1))
    try:
        tmp.rename(out)
    except OSError:  # another process won the race; its folder is identical
        pass
    return str(out)


def _select_attention_backend(args: Any) -> None:
    """On CUDA, full attention runs through the PRISM backend unless the user chose another
    (``--attention-backend`` or ``--attention-config``). It is passed to vLLM as its CUSTOM
    member, which every vLLM process can unpickle (prism_attn.PROCESS_SAFE_MEMBER)."""
    from vllm.platforms import current_platform

    from vllm_prism.attention.backends.prism_attn import (PROCESS_SAFE_MEMBER,
                                                          is_prism_choice)

    if is_prism_choice(args.attention_backend):
        args.attention_backend = PROCESS_SAFE_MEMBER
    if not current_platform.is_cuda():
        return
    config_backend = getattr(getattr(args, "attention_config", None), "backend", None)
    if args.attention_backend is None and config_backend is None:
        args.attention_backend = PROCESS_SAFE_MEMBER
    if args.attention_backend == PROCESS_SAFE_MEMBER:
        _select_draft_attention_backend(args)


def _select_draft_attention_backend(args: Any) -> None:
    """With an INT8 KV cache a drafter's attention (DFlash, EAGLE) runs on the PRISM backend
    too, unless the speculative config names one or ``VLLM_PRISM_DRAFT_ATTENTION=vllm``.

    vLLM 0.32 selects a draft's attention backend on its own, never inheriting the target's;
    for a DFlash draft (non-causal) with ``int8_per_token_head`` it lands on vLLM's Triton
    attention, whose launcher walks the whole context in one program per KV head for any
    request of more than one query token: 2.1 ms of a 10.5 ms verification step at a 32K
    context on the H200 (benchmarks/results/e2e_h200_notes.md, twelfth run). PRISM is that
    backend's subclass: the draft blocks run its split-KV path (the step took 8.40 against
    11.24 ms, thirteenth run), and the layers it does not take (sliding windows) still run
    vLLM's Triton kernel. With a 16-bit cache vLLM's choice (FlashAttention) stands."""
    from vllm_prism import envs

    spec = getattr(args, "speculative_config", None)
    if (envs.VLLM_PRISM_DRAFT_ATTENTION != "prism" or not isinstance(spec, dict)
            or spec.get("attention_backend") is not None):
        return
    kv = spec.get("kv_cache_dtype") or getattr(args, "kv_cache_dtype", None)
    if kv != "int8_per_token_head":
        return
    from vllm_prism.attention.backends.prism_attn import PROCESS_SAFE_MEMBER

    args.speculative_config = {**spec, "attention_backend": PROCESS_SAFE_MEMBER}
    logger.info("vllm-prism: the drafter's attention runs on the PRISM backend (INT8 KV "
                "cache; VLLM_PRISM_DRAFT_ATTENTION=vllm leaves it to vLLM)")


def _select_gdn_prefill_backend(args: Any) -> None:
    """On CUDA without FlashInfer, run Gated DeltaNet prefill on vLLM's Triton kernels
    (vLLM 0.32's "auto" picks FlashInfer's kernel on Hopper and fails at the first prefill
    when the package is absent); with FlashInfer present, or a backend chosen by the user
    (``--gdn-prefill-backend`` or ``additional_config``), vLLM's choice stands."""
    import importlib.util

    from vllm.platforms import current_platform

    if not current_platform.is_cuda() or importlib.util.find_spec("flashinfer") is not None:
        return
    extra = args.additional_config if isinstance(args.additional_config, dict) else {}
    if getattr(args, "gdn_prefill_backend", None) is not None or "gdn_prefill_backend" in extra:
        return
    args.gdn_prefill_backend = "triton"
    logger.info_once("vllm-prism: FlashInfer is not installed; Gated DeltaNet prefill runs on "
                     "vLLM's Triton kernels (--gdn-prefill-backend triton)")


# Projections vLLM splits along their input (row-parallel) under tensor parallelism.
ROW_PARALLEL_SUFFIXES = (".attn_output.weight", ".ssm_out.weight", ".ffn_down.weight")


def largest_tensor_parallel_size(path: str | os.PathLike, limit: int = 64) -> int:
    """The largest tensor-parallel size at which every row-parallel projection of the file
    splits into whole Hadamard blocks (and whole quantization blocks) per rank."""
    from vllm_prism.gguf.hadamard import parse_hadamard_contract
    from vllm_prism.gguf.reader import GGUFReader

    with GGUFReader(path) as reader:
        widths = {n: i.ne[0] for n, i in reader.tensors.items()}
        contract = parse_hadamard_contract(reader.metadata, widths, reader.path)
        blocks = {n: i.layout.block_size for n, i in reader.tensors.items()
                  if n.endswith(ROW_PARALLEL_SUFFIXES)}
    hadamard = contract.block_size if contract is not None else 1
    need = {widths[n]: max(b, hadamard) for n, b in blocks.items()}
    return max((t for t in range(1, limit + 1)
                if all(k % (t * b) == 0 for k, b in need.items())), default=1)


def _check_tensor_parallel(args: Any, path: str) -> None:
    """Refuse, before the engine starts, a tensor-parallel size that would cut a Hadamard
    block (or a quantization block) of a row-parallel projection across two ranks."""
    tp = int(getattr(args, "tensor_parallel_size", 1) or 1)
    if tp == 1:
        return
    best = largest_tensor_parallel_size(path)
    if best % tp:
        raise ValueError(f"vllm-prism cannot serve {path} with --tensor-parallel-size {tp}: "
                         "its row-parallel projections (attn_output, ssm_out, ffn_down) would "
                         "split a Hadamard block across ranks; the largest tensor-parallel size "
                         f"that keeps every block on one rank is {best} (use a divisor of it)")


def _check_switches() -> None:
    """VLLM_PRISM_* switches the kernels parse, checked before the engine starts (a bad value
    raises a ValueError naming the variable)."""
    from vllm_prism import envs
    from vllm_prism.kernels.pq2.triton_gemv import parse_gemv_tuning

    parse_gemv_tuning(envs.VLLM_PRISM_GEMV_TUNING)
    for name in envs.CHOICES:
        envs.choice(name)  # refuses a value outside the switch's set


def prepare_gguf_engine_args(args: Any) -> None:
    """Point ``args`` (an EngineArgs) at our config source, loader and quantization."""
    if not is_gguf_model(args.model):
        if args.quantization == QUANTIZATION:
            raise ValueError(f"--quantization {QUANTIZATION} needs a Bonsai .gguf file as the "
                             f"model, got {args.model!r}")
        return
    path = str(args.model)
    user_tokenizer = args.tokenizer not in (None, "", path)
    skip_tokenizer = bool(getattr(args, "skip_tokenizer_init", False))
    report = check_gguf_for_serving(path, own_tokenizer=not (user_tokenizer or skip_tokenizer))
    _check_tensor_parallel(args, path)
    _check_switches()
    if args.quantization not in (None, QUANTIZATION):
        raise ValueError(f"--quantization {args.quantization} cannot be used with the Bonsai "
                         f"GGUF file {path}; leave it unset or pass {QUANTIZATION}")
    args.quantization = QUANTIZATION
    args.config_format = CONFIG_FORMAT
    args.load_format = LOAD_FORMAT
    if not user_tokenizer:
        # skip_tokenizer_init with a file that has no tokenizer: nothing to materialise
        args.tokenizer = None if skip_tokenizer and report.tokenizer is None \
            else materialize_tokenizer(path)
    if args.served_model_name is None:
        args.served_model_name = path
    # An absolute path: vLLM looks a relative one up on the model hub first (its generation
    # config), which costs half a minute of retries offline.
    args.model = str(Path(path).resolve())
    _select_attention_backend(args)
    _select_gdn_prefill_backend(args)
    logger.info("vllm-prism: serving %s (tokenizer %s)", path, args.tokenizer)


def install_engine_args_hook() -> None:
    """Run prepare_gguf_engine_args when EngineArgs builds the engine config (once), and keep
    vLLM's speculators probe, which reads the model path as a JSON config, off GGUF files."""
    import vllm.engine.arg_utils as arg_utils

    engine_args = arg_utils.EngineArgs
    if getattr(engine_args.create_engine_config, "_prism_hook", False):
        return
    original_create = engine_args.create_engine_config
    original_probe = arg_utils.maybe_override_with_speculators

    def create_engine_config(self, *args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        prepare_gguf_engine_args(self)
        return original_create(self, *args, **kwargs)

    def maybe_override_with_speculators(model: Any, tokenizer: Any, *args: Any,
                                        vllm_speculative_config: Any = None, **kwargs: Any):
        if is_gguf_model(model):
            return model, tokenizer, vllm_speculative_config
        return original_probe(model, tokenizer, *args,
                              vllm_speculative_config=vllm_speculative_config, **kwargs)

    create_engine_config._prism_hook = True  # type: ignore[attr-defined]
    engine_args.create_engine_config = create_engine_config  # type: ignore[method-assign]
    arg_utils.maybe_override_with_speculators = maybe_override_with_speculators
