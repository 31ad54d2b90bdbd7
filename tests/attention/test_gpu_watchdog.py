"""(CPU) The GPU tests' watchdog (attn_helpers.synchronize_or_fail, tests/conftest.py): GPU work
that never finishes fails the test with the call's description and marks the run to end after
pytest's report, so a hung kernel costs a device call its remaining tests, not its whole time."""
from __future__ import annotations

import os

import pytest
import torch
from attn_helpers import GPU_HUNG_ENV, synchronize_or_fail


@pytest.fixture(autouse=True)
def _hung_mark_cleared():
    """The watchdog sets GPU_HUNG_ENV, which ends the whole run at exit (tests/conftest.py):
    clear it after each test here whatever the test did (monkeypatch.delenv of an unset name
    records nothing to undo, and a leaked mark once failed CI with exit 3 after every test
    passed)."""
    saved = os.environ.pop(GPU_HUNG_ENV, None)
    yield
    os.environ.pop(GPU_HUNG_ENV, None)
    if saved is not None:
        os.environ[GPU_HUNG_ENV] = saved


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
    with pytest.raises(pytest.fail.Exception, match="has not finished.*num_segs=7"):
        synchronize_or_fail("verify_attention, num_segs=7", seconds=0.05)
    assert os.environ[GPU_HUNG_ENV] == "verify_attention, num_segs=7"


def test_finished_work_passes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Done)
    synchronize_or_fail("decode_attention", seconds=0.05)
    assert GPU_HUNG_ENV not in os.environ


def test_conftest_names_the_same_variable():
    import conftest

    assert conftest.GPU_HUNG_ENV == GPU_HUNG_ENV
