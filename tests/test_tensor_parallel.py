"""Tensor parallelism with Hadamard-folded weights, on the CPU: each rank's sign slice and
row bytes, and the refusal (before the engine starts) of a size that cuts a Hadamard block."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from test_engine_args import _args  # noqa: E402

from vllm_prism.engine.arg_utils import (largest_tensor_parallel_size,  # noqa: E402
                                         prepare_gguf_engine_args)
from vllm_prism.gguf.constants import GGMLType  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_gguf) -> Path:
    return tiny_gguf("pq2_0")


def test_largest_size_keeps_blocks_whole(tiny: Path) -> None:
    # tiny widths: attn_output 384, ssm_out 384, ffn_down 512; blocks of 128 -> 384 / 128 = 3
    # and 512 / 128 = 4 share only 1
    assert largest_tensor_parallel_size(tiny) == 1


@pytest.mark.parametrize("tp", [2, 4])
def test_refused_before_the_engine_with_the_size_that_works(tiny: Path, tmp_path: Path,
                                                            monkeypatch, tp: int) -> None:
    monkeypatch.setenv("VLLM_PRISM_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError) as e:
        prepare_gguf_engine_args(_args(str(tiny), tensor_parallel_size=tp))
    msg = str(e.value)
    assert str(tiny) in msg and f"--tensor-parallel-size {tp}" in msg
    assert "largest tensor-parallel size that keeps every block on one rank is 1" in msg


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_gets_its_sign_slice_and_row_bytes(tiny: Path, monkeypatch,
                                                     rank: int) -> None:
    """A row-parallel layer at TP=2 (K = 512 -> 256 per rank): the rank's signs are its
    slice of the contract's vector and its rows hold 256 / 128 blocks of 34 bytes."""
    from vllm_prism.model_executor.layers.quantization import prism

    monkeypatch.setattr(prism, "get_tensor_model_parallel_rank", lambda: rank)
    cfg = prism.PrismConfig(int(GGMLType.PQ2_0), 128, 128, str(tiny))
    layer = torch.nn.Module()
    prism.PrismLinearMethod(cfg).create_weights(layer, 256, [384], 512, 384, torch.bfloat16)
    full = cfg.signs_for(512)
    np.testing.assert_array_equal(layer.prism_signs.numpy(), full[rank * 256:(rank + 1) * 256])
    assert tuple(layer.weight.shape) == (384, 256 // 128 * 34)


def test_a_cut_block_is_refused_where_weights_are_partitioned(tiny: Path, monkeypatch) -> None:
    from vllm_prism.model_executor.layers.quantization import prism

    monkeypatch.setattr(prism, "get_tensor_model_parallel_rank", lambda: 0)
    cfg = prism.PrismConfig(int(GGMLType.PQ2_0), 128, 128, str(tiny))
    with pytest.raises(ValueError, match="per rank 64 is not a multiple of the"):
        # 384 / 3 = 128 would fit; 512 / 8 = 64 cuts a block
        prism.PrismLinearMethod(cfg).create_weights(types.SimpleNamespace(
            register_parameter=lambda *a: None, register_buffer=lambda *a, **k: None),
            64, [384], 512, 384, torch.bfloat16)
