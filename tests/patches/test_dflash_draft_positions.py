"""Patch dflash_draft_positions: a DFlash drafter's rotary table covers the target's context.

Configs only (no weights, no engine): a Qwen3 target folder served at ``max_model_len`` 32768
and a DFlash drafter folder whose checkpoint says ``max_position_embeddings`` 4096 (what
vllm-prism's tiny drafter wrote for the 27B-shaped target before it took the target's length);
on the H200 such a drafter crashed the engine at a 32K prompt with a device-side assert in its
rotary gather. tests/spec_decode/test_dflash_gpu.py runs a 16-position drafter through vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm_prism.patches import dflash_draft_positions  # noqa: E402

TARGET_LEN = 32768
DRAFT_POSITIONS = 4096


def _folder(path: Path, **config) -> str:
    path.mkdir(parents=True, exist_ok=True)
    base = {"model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 64, "vocab_size": 512, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
            "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    (path / "config.json").write_text(json.dumps({**base, **config}))
    return str(path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("dflash_positions")
    dflash = {"architectures": ["DFlashDraftModel"], "num_hidden_layers": 1,
              "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": 3}}
    return {"target": _folder(tmp / "target", architectures=["Qwen3ForCausalLM"],
                              max_position_embeddings=2 * TARGET_LEN),
            "short": _folder(tmp / "short", max_position_embeddings=DRAFT_POSITIONS, **dflash),
            "long": _folder(tmp / "long", max_position_embeddings=4 * TARGET_LEN, **dflash)}


def _draft_positions(folders: dict[str, str], drafter: str,
                     speculative_len: int | None = None) -> tuple[int, int, int]:
    """(max_position_embeddings of the draft config the drafter is built from, of the
    checkpoint config inside it, the draft's max_model_len) after vLLM's SpeculativeConfig
    has set the draft up; ``speculative_len``: the speculative config's own max_model_len."""
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    target = ModelConfig(model=folders["target"], max_model_len=TARGET_LEN,
                         skip_tokenizer_init=True, dtype="bfloat16")
    spec = SpeculativeConfig(method="dflash", model=folders[drafter], num_speculative_tokens=3,
                             target_model_config=target, target_parallel_config=ParallelConfig(),
                             max_model_len=speculative_len)
    hf = spec.draft_model_config.hf_config
    return (hf.max_position_embeddings, hf.model.max_position_embeddings,
            spec.draft_model_config.max_model_len)


def test_vllm_alone_keeps_the_drafters_short_table(folders, monkeypatch) -> None:
    """The bug, on vLLM's own __post_init__: the drafter's table stops at 4096 positions while
    the target serves 32768 (when this fails, vLLM covers dflash itself: drop the patch)."""
    from vllm.config import SpeculativeConfig

    dflash_draft_positions.apply()
    monkeypatch.setattr(SpeculativeConfig, "__post_init__",
                        SpeculativeConfig.__post_init__.__wrapped__)
    assert _draft_positions(folders, "short") == (DRAFT_POSITIONS,) * 3


def test_the_patch_raises_the_table_to_the_targets_length(folders) -> None:
    """The table and the draft's max_model_len (derived from the drafter's own positions
    before the table was raised: left there, the drafter's attention covered only that much
    context on vLLM's CPU build, tests/spec_decode/test_dflash_cpu.py)."""
    dflash_draft_positions.apply()
    assert _draft_positions(folders, "short") == (TARGET_LEN,) * 3


def test_a_speculative_max_model_len_set_by_the_user_stays(folders) -> None:
    dflash_draft_positions.apply()
    assert _draft_positions(folders, "short", speculative_len=2048) == (TARGET_LEN,
                                                                        TARGET_LEN, 2048)


def test_a_drafter_that_covers_the_target_keeps_its_own_table(folders) -> None:
    dflash_draft_positions.apply()
    assert _draft_positions(folders, "long") == (4 * TARGET_LEN, 4 * TARGET_LEN, TARGET_LEN)
