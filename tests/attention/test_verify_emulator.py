"""The lane-level emulation of the warpgroup-MMA verification kernel's index mapping
(scripts/emulate_verify_wgmma.py) in CI, on a few cases: every value through wgmma's register
fragments, its shared-memory descriptors, movmatrix and prmt as the PTX ISA defines them,
lane by lane as the kernel moves them, against a float reference. The script's full sweep
(every head size, n-tile count, row offset, producer and maxima form: ~3 minutes) runs before
a change to the kernel goes to a GPU; these cases keep the emulation itself from rotting
between such changes: both head sizes, both producers (cp.async rows at 0 and 8 mod 16, TMA
boxes of a head in the middle and of the last head), both maxima forms, with the score spike
and the V-scale jumps that send lazy stages back to the exact path (asserted inside)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "emulate_verify_wgmma.py"


def _emulator():
    spec = importlib.util.spec_from_file_location("emulate_verify_wgmma", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# (head size, n-tiles, row offset, TMA head or None, lazy maxima)
CASES = [(256, 5, 8, None, True), (256, 6, 0, 3, True), (128, 2, 0, None, False),
         (128, 3, 0, 2, True)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "hd{}_nt{}_shift{}_tma{}_lazy{}".format(*c))
def test_emulated_kernel_matches_reference(case):
    hd, nt, shift, head, lazy = case
    emulator = _emulator()
    err = emulator.emulate(7 + nt, hd, nt, shift, lazy, 5, tma_head=head)
    # fp16 operands give ~4e-4; an index error gives ~1e-1 (the script's own bound)
    assert emulator.ERROR_BOUND <= 3e-3
    assert err < emulator.ERROR_BOUND, err
