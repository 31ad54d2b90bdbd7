"""A tiny DFlash drafter that matches a tiny Bonsai target, for tests and demos.

``vllm-prism make-tiny-drafter OUT_DIR --target TINY.gguf`` writes a DFlash drafter (vLLM's
``DFlashDraftModel``, Qwen3 layers; one drafting layer, ``--layers`` adds pass-through ones) as
``config.json`` + ``model.safetensors``. It
shares the target's embedding and LM head (it has none of its own) and is *built*, not
trained, to agree with the tiny target on the first drafted token:

* the tiny target's next token is the successor of the current one on a fixed cycle (its LM
  head row of token j is the embedding of j's predecessor, see vllm_prism.gguf.tiny), so the
  drafter only has to carry the anchor token's embedding to the draft positions;
* queries and keys are zero, so every draft position attends uniformly; the context K/V
  (from the target's hidden states through ``fc``, which is zero) and the mask token's value
  are zero, because the value projection maps onto a 128-dim subspace orthogonal to the mask
  token's (normalised, primal) embedding; only the anchor's value remains;
* the output projection scales that value up by 1e4 so it dominates the residual stream, and
  the MLP is zero; the shared LM head then scores the anchor's successor highest.

Drafts after the first repeat the first (a successor of a successor needs more than one
copy), so the mean accepted length is about one token: far above chance (1 / vocab), which is
what the speculative-decoding tests need to show that acceptance is measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

VALUE_DIMS = 128  # 2 KV heads x 64
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
OUTPUT_SCALE = 1.0e4


def _primal_embedding_row(path: str, token: int) -> tuple[np.ndarray, int, int, int, int]:
    """(the primal embedding of ``token``, vocab, hidden, layer count, context length) of a
    GGUF target."""
    from vllm_prism.gguf.codecs import dequantize
    from vllm_prism.gguf.hadamard import inverse_embedding_transform, parse_hadamard_contract
    from vllm_prism.gguf.qwen35 import qwen35_text_config
    from vllm_prism.gguf.reader import GGUFReader

    with GGUFReader(path) as r:
        info = r.tensors["token_embd.weight"]
        vocab, hidden = info.shape
        config = qwen35_text_config(r.metadata, r.path, vocab_size=vocab)
        raw = np.asarray(r.raw("token_embd.weight")[token:token + 1])
        z = dequantize(raw, info.ggml_type).astype(np.float64)
        widths = {n: i.ne[0] for n, i in r.tensors.items()}
        contract = parse_hadamard_contract(r.metadata, widths, r.path)
    row = z[0] if contract is None else inverse_embedding_transform(
        z, contract.signs_for(hidden), contract.block_size)[0]
    return (row, vocab, hidden, int(config["num_hidden_layers"]),
            int(config["max_position_embeddings"]))


def make_tiny_drafter(out_dir: str | os.PathLike, target: str | os.PathLike, *,
                      mask_token_id: int = 1, seed: int = 0, layers: int = 1,
                      sliding_window: int | None = None,
                      max_positions: int | None = None) -> dict[str, Any]:
    """Write the drafter for ``target`` into ``out_dir``; returns a summary.

    Layer 0 does the drafting; ``layers - 1`` more layers with zero projections pass the
    hidden state through unchanged (the layer count and attention type of a real drafter,
    e.g. DFlash2's 5 sliding-window layers, for KV-cache planning; acceptance is the same).
    ``sliding_window`` makes every layer sliding-window attention (``dflash_config.use_swa``).
    ``max_positions`` is the drafter's ``max_position_embeddings`` (default: the target's
    context length); a smaller one is what a drafter trained on shorter sequences says (vLLM
    raises it to the target's length: patch ``dflash_draft_positions``).
    """
    if layers < 1:
        raise ValueError(f"a drafter has at least one layer, got {layers}")
    import torch
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mask, vocab, hidden, n_layers, context = _primal_embedding_row(str(target), mask_token_id)
    if hidden < VALUE_DIMS + 1:
        raise ValueError(f"{target}: hidden size {hidden} is too small for the tiny drafter")
    target_layers = [n_layers // 4, n_layers // 2]
    u = mask / np.linalg.norm(mask)
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(np.concatenate([u[:, None], rng.standard_normal((hidden, hidden))],
                                           axis=1))
    value_basis = basis[:, 1:VALUE_DIMS + 1]  # orthogonal to the mask embedding
    o_proj = np.zeros((hidden, HEADS * HEAD_DIM))
    half = VALUE_DIMS // KV_HEADS
    # head 0 reads KV head 0, head 2 reads KV head 1 (GQA 2:1)
    o_proj[:, 0:HEAD_DIM] = OUTPUT_SCALE * value_basis[:, :half]
    o_proj[:, 2 * HEAD_DIM:3 * HEAD_DIM] = OUTPUT_SCALE * value_basis[:, half:]
    inter = 2 * hidden
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": vocab,
        "rms_norm_eps": 1e-6, "max_position_embeddings": max_positions or context,
        "rope_theta": 1e6,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "dflash_config": {"target_layer_ids": target_layers, "mask_token_id": mask_token_id},
    }
    if sliding_window is not None:
        config["dflash_config"].update(use_swa=True, swa_window_size=sliding_window)
    (out / "config.json").write_text(json.dumps(config, indent=1))

    def bf16(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    p = "layers.0."
    weights = {
        "fc.weight": zeros(hidden, hidden * len(target_layers)),
        "hidden_norm.weight": ones(hidden), "norm.weight": ones(hidden),
        p + "self_attn.q_proj.weight": zeros(HEADS * HEAD_DIM, hidden),
        p + "self_attn.k_proj.weight": zeros(KV_HEADS * HEAD_DIM, hidden),
        p + "self_attn.v_proj.weight": bf16(value_basis.T),
        p + "self_attn.o_proj.weight": bf16(o_proj),
        p + "self_attn.q_norm.weight": ones(HEAD_DIM),
        p + "self_attn.k_norm.weight": ones(HEAD_DIM),
        p + "mlp.gate_proj.weight": zeros(inter, hidden),
        p + "mlp.up_proj.weight": zeros(inter, hidden),
        p + "mlp.down_proj.weight": zeros(hidden, inter),
        p + "input_layernorm.weight": ones(hidden),
        p + "post_attention_layernorm.weight": ones(hidden),
    }
    for i in range(1, layers):  # pass-through layers: zero attention and MLP outputs
        for name, t in list(weights.items()):
            if name.startswith(p):
                weights[f"layers.{i}." + name[len(p):]] = (
                    t.clone() if name.endswith("norm.weight") else torch.zeros_like(t))
    save_file(weights, str(out / "model.safetensors"))
    return {"path": os.fspath(out), "hidden": hidden, "vocab": vocab,
            "target_layer_ids": target_layers, "mask_token_id": mask_token_id}
