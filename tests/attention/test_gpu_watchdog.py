"""(CPU) The GPU tests' watchdog (attn_helpers.synchronize_or_fail, tests/conftest.py): GPU work
that never finishes fails the test with the call's description and marks the run to end after
pytest's report, so a hung kernel costs a device call its remaining tests, not its whole time."""
from __future__ import annotations

import os

import pytest
import torch
from attn_helpers import GPU_HUNG_ENV, synchronize_or_fail


class _NeverDone:
    def record(self) -> None:
        pass

    def query(self) -> bool:
        return False


class _Done(_NeverDone):
    def query(self) -> bool:
        return True


def test_hung_work_fails_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _NeverDone)
    monkeypatch.delenv(GPU_HUNG_ENV, raising=False)  # unset again after the test
    with pytest.raises(pytest.fail.Exception, match="has not finished.*num_segs=7"):
        synchronize_or_fail("verify_attention, num_segs=7", seconds=0.05)
    assert os.environ[GPU_HUNG_ENV] == "verify_attention, num_segs=7"


def test_finished_work_passes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Done)
    monkeypatch.delenv(GPU_HUNG_ENV, raising=False)
    synchronize_or_fail("decode_attention", seconds=0.05)
    assert GPU_HUNG_ENV not in os.environ


def test_conftest_names_the_same_variable():
    import conftest

    assert conftest.GPU_HUNG_ENV == GPU_HUNG_ENV
