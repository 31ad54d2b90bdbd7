"""The independent reference implementation the end-to-end tests compare vLLM against.

A Bonsai GGUF file is turned back into a plain Hugging Face Qwen3.5 text model: every tensor
is dequantized to float32, llama.cpp's conversions are undone and the Hadamard rotation is
un-folded into primal weights, and transformers' own ``Qwen3_5ForCausalLM`` runs them on the
CPU with its reference PyTorch paths (no fla, no causal-conv1d, no hub kernels). Nothing of
vllm-prism's serving path (loader, linear method, transform op, kernels) is used: only the
format layer (reader, codecs, the Hadamard and qwen35 helpers, the tokenizer), which has its
own unit tests.

This is test helper code; it imports torch and transformers at import time.
"""

from __future__ import annotations

import importlib.util
import inspect
import os

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

from vllm_prism.gguf.codecs import dequantize
from vllm_prism.gguf.constants import GGMLType
from vllm_prism.gguf.hadamard import (parse_hadamard_contract, primal_embedding,
                                      primal_weight)
from vllm_prism.gguf.qwen35 import (gguf_to_hf_name, gguf_to_hf_tensor, qwen35_dims,
                                    qwen35_text_config)
from vllm_prism.gguf.reader import GGUFReader
from vllm_prism.gguf.tokenizer import build_tokenizer, read_tokenizer_data

__all__ = ["unfold_gguf", "load_reference_model", "load_reference_tokenizer", "greedy",
           "teacher_forced_logprobs", "top2_margins", "logits"]

# The GatedDeltaNet helpers transformers may route to an optional package (fla,
# causal-conv1d) instead of its reference torch code.
_GDN_FUNCTIONS = ("causal_conv1d_update", "causal_conv1d_fn", "torch_chunk_gated_delta_rule",
                  "torch_recurrent_gated_delta_rule")


def _force_torch_gdn() -> None:
    """Make transformers' Qwen3.5 GatedDeltaNet run its reference torch code.

    Each helper is wrapped by ``use_kernel_func_from_hub_with_fallback``, which picks fla or
    causal-conv1d when they are importable (CUDA/Triton only). Where one was picked, the
    module global is pointed back at the torch function the wrapper was built around.
    """
    for name in _GDN_FUNCTIONS:
        fn = getattr(modeling_qwen3_5, name)
        torch_fn = getattr(fn, "__wrapped__", None)
        try:
            uses_package = bool(inspect.getclosurevars(fn).nonlocals.get(
                "is_new_implementation", False))
        except TypeError:
            uses_package = False
        if uses_package and torch_fn is not None:
            setattr(modeling_qwen3_5, name, torch_fn)


def _optional_kernel_packages() -> list[str]:
    return [p for p in ("fla", "causal_conv1d") if importlib.util.find_spec(p) is not None]


# ---------------------------------------------------------------------------------------
# GGUF -> primal Hugging Face state dict
# ---------------------------------------------------------------------------------------


def _dequantized(reader: GGUFReader, name: str) -> np.ndarray:
    """float32 values of one tensor in numpy order (ne reversed)."""
    info = reader.tensors[name]
    group = info.layout.block_size if info.ggml_type == GGMLType.Q2_0 else None
    values = dequantize(reader.raw(name), info.ggml_type, group=group)
    return np.ascontiguousarray(values.reshape(info.shape), dtype=np.float32)


def llama_cpp_untile_columns(values: np.ndarray, n_k_heads: int, n_v_heads: int,
                             head_dim: int) -> np.ndarray:
    """Hugging Face column order of a matrix whose value-head input columns llama.cpp's
    converter tiled. The converter's rule (``_LinearAttentionVReorderBase``): the value head
    of key head ``k`` and repeat ``r`` (Hugging Face slot ``k * R + r``, grouped) is written
    at slot ``r * K + k`` (tiled). Written out here loop by loop, independent of the loader's
    permutation helpers."""
    reps = n_v_heads // n_k_heads
    out = np.empty_like(values)
    for k in range(n_k_heads):
        for r in range(reps):
            src = (r * n_k_heads + k) * head_dim
            dst = (k * reps + r) * head_dim
            out[:, dst:dst + head_dim] = values[:, src:src + head_dim]
    return out


def unfold_gguf(path: str | os.PathLike, *, legacy_gdn_v_grouped: bool = False,
                skip_unfold: bool = False,
                ) -> tuple[Qwen3_5TextConfig, dict[str, torch.Tensor]]:
    """The Hugging Face Qwen3.5 text config and the primal float32 state dict of a GGUF file.

    Per tensor, on float64 values: dequantize; un-fold the Hadamard rotation (forward-folded
    weights ``w = s ⊙ Hblk(w_st)`` per row, the inverse-folded embedding ``s ⊙ Hblk(z)`` per
    row, with the sign vector of the tensor's input width); then undo llama.cpp's
    conversions (``gguf_to_hf_tensor``: norms stored as 1 + w, ``ssm_a`` as -exp(A_log),
    tiled value-head rows). The un-fold comes first because the fold acts on the input axis
    as the file stores it: row permutations commute with it, and a column reorder of
    ``ssm_out`` (only when ``gdn_v_grouped`` is false) is then applied to primal columns.
    A folded ``ssm_out`` with tiled columns is ambiguous (was it folded before or after
    the tiling?) and is refused, as the loader refuses it.

    Files without a ``prism.hadamard`` contract (legacy Q2_0) are used as stored, laid out as
    llama.cpp's converter lays them out: their ``ssm_out`` columns are un-tiled here by
    :func:`llama_cpp_untile_columns` (``legacy_gdn_v_grouped=True`` would read them as
    grouped, the loader's old mistake, kept to show the tests can tell). ``skip_unfold``
    uses folded weights as if they were primal (a forgotten rotation), for the same purpose.
    """
    path = os.fspath(path)
    with GGUFReader(path) as reader:
        md = reader.metadata
        vocab = reader.tensors["token_embd.weight"].shape[0]
        dims = qwen35_dims(md, path, vocab_size=vocab)
        config = Qwen3_5TextConfig(**qwen35_text_config(md, path, vocab_size=vocab))
        widths = {n: info.ne[0] for n, info in reader.tensors.items()}
        contract = parse_hadamard_contract(md, widths, path)
        grouped = contract.gdn_v_grouped if contract is not None else legacy_gdn_v_grouped
        state: dict[str, torch.Tensor] = {}
        for name in reader.tensors:
            hf_name = gguf_to_hf_name(name)
            if hf_name is None:
                raise ValueError(f"{path}: tensor {name!r} has no Hugging Face counterpart")
            values = _dequantized(reader, name).astype(np.float64)
            if skip_unfold:
                pass
            elif contract is not None and contract.is_folded(name):
                if name.endswith(".ssm_out.weight") and not grouped:
                    raise ValueError(f"{path}: {name} is folded but gdn_v_grouped is false")
                values = primal_weight(values, contract.signs_for(widths[name]),
                                       contract.block_size)
            elif contract is not None and contract.is_inverse_folded(name):
                values = primal_embedding(values, contract.signs_for(widths[name]),
                                          contract.block_size)
            if contract is None and name.endswith(".ssm_out.weight"):
                if not grouped:
                    values = llama_cpp_untile_columns(values, dims.n_k_heads, dims.n_v_heads,
                                                      dims.head_v_dim)
                values = gguf_to_hf_tensor(name, values, dims, gdn_v_grouped=True, path=path)
            else:
                values = gguf_to_hf_tensor(name, values, dims, gdn_v_grouped=grouped,
                                           path=path)
            state[hf_name] = torch.from_numpy(np.array(values, dtype=np.float32))
    return config, state


def load_reference_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
                         **unfold_kwargs: object) -> Qwen3_5ForCausalLM:
    """transformers' ``Qwen3_5ForCausalLM`` with the primal weights of ``path``, in eval
    mode, eager attention, torch GatedDeltaNet. Missing or unexpected keys are an error."""
    _force_torch_gdn()
    config, state = unfold_gguf(path, **unfold_kwargs)  # type: ignore[arg-type]
    config._attn_implementation = "eager"
    model = Qwen3_5ForCausalLM(config)
    result = model.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    return model.to(dtype).eval()


def load_reference_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """The GGUF's own byte-level BPE tokenizer as a transformers fast tokenizer."""
    path = os.fspath(path)
    with GGUFReader(path) as reader:
        data = read_tokenizer_data(reader.metadata, path)
    tokens = data.tokens
    special = {f"{kind}_token": tokens[i] for kind, i in data.special_ids.items()}
    tok = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(data), **special)
    if data.chat_template:
        tok.chat_template = data.chat_template
    return tok


# ---------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------


@torch.inference_mode()
def logits(model: Qwen3_5ForCausalLM, ids: list[int]) -> torch.Tensor:
    """float32 logits [len(ids), vocab] of one sequence, computed in one forward pass."""
    if not ids:
        raise ValueError("need at least one token")
    out = model(input_ids=torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    return out.logits[0].float()


def greedy(model: Qwen3_5ForCausalLM, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of exactly ``max_new_tokens`` tokens (EOS does not stop it, as
    with vLLM's ``ignore_eos``). Every step re-runs the whole sequence without a cache, so
    the only code path is the full-sequence forward; ties go to the lowest token id."""
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(int(torch.argmax(logits(model, ids)[-1])))
    return ids[len(prompt_ids):]


def teacher_forced_logprobs(model: Qwen3_5ForCausalLM, ids: list[int]) -> torch.Tensor:
    """float32 [len(ids), vocab]: row t is the log-softmax of the distribution of token t+1
    given ids[: t + 1] (the last row predicts past the end)."""
    return torch.log_softmax(logits(model, ids), dim=-1)


def reference_run(model: Qwen3_5ForCausalLM, prompts: list[list[int]],
                  max_new_tokens: int) -> dict:
    """Greedy continuations of ``prompts`` and the teacher-forced log-probability of every
    token after the first of each prompt + continuation: what the e2e tests compare with."""
    greedy_ids = [greedy(model, p, max_new_tokens)[-max_new_tokens:] for p in prompts]
    full = [p + g for p, g in zip(prompts, greedy_ids)]
    scores = []
    for ids in full:
        lp = teacher_forced_logprobs(model, ids)
        scores.append([lp[t - 1, ids[t]].item() for t in range(1, len(ids))])
    return {"prompts": prompts, "greedy": greedy_ids, "full": full, "score": scores}


def top2_margins(model: Qwen3_5ForCausalLM, ids: list[int]) -> torch.Tensor:
    """float32 [len(ids)]: top-1 minus top-2 logit at every position."""
    top = torch.topk(logits(model, ids), k=2, dim=-1).values
    return top[:, 0] - top[:, 1]
