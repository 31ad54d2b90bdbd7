"""When the PQ2 kernels use programmatic dependent launch: with VLLM_PRISM_PDL=1, on Hopper or
newer CUDA GPUs with a Triton that supports it, never the interpreter or the CPU; off by
default."""

from __future__ import annotations

import pytest
import torch

from vllm_prism.kernels import common


@pytest.fixture
def gpu(monkeypatch):
    """A pretend CUDA device of a chosen capability, with a PDL-capable Triton."""
    def make(cap: tuple[int, int]) -> torch.device:
        monkeypatch.setattr(common, "device_capability", lambda d: cap)
        monkeypatch.setattr(common, "_triton_has_pdl", lambda: True)
        monkeypatch.setattr(common, "interpreting", lambda: False)
        return torch.device("cuda", 0)
    return make


def test_off_by_default(gpu, monkeypatch) -> None:
    monkeypatch.delenv("VLLM_PRISM_PDL", raising=False)
    assert not common.use_pdl(gpu((9, 0)))


def test_on_for_hopper_and_newer(gpu, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PRISM_PDL", "1")
    assert common.use_pdl(gpu((9, 0)))
    assert common.use_pdl(gpu((10, 0)))
    assert common.pdl_launch(True) == {"launch_pdl": True}


def test_off_before_hopper(gpu, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PRISM_PDL", "1")
    assert not common.use_pdl(gpu((8, 9)))
    assert common.pdl_launch(False) == {}


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_switch_turns_it_off(gpu, monkeypatch, value: str) -> None:
    monkeypatch.setenv("VLLM_PRISM_PDL", value)
    assert not common.use_pdl(gpu((9, 0)))


def test_never_on_cpu(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_PRISM_PDL", "1")
    assert not common.use_pdl(torch.device("cpu"))
