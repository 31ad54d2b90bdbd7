"""docs/switches.md and vllm_prism/envs.py name the same switches: each variable envs.py reads
has a row in the table (its name, default and meaning), and each variable the page names in
backticks is one envs.py reads."""

from __future__ import annotations

import re
from pathlib import Path

from vllm_prism import envs

DOC = Path(__file__).resolve().parents[1] / "docs" / "switches.md"


def _table_rows() -> dict[str, str]:
    """The table's first column (the variable) -> its default column."""
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `(VLLM_PRISM_[A-Z0-9_]+)` \| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def test_every_switch_has_a_row() -> None:
    rows = _table_rows()
    assert set(envs.environment_variables) <= set(rows), \
        sorted(set(envs.environment_variables) - set(rows))


def test_the_page_names_no_unknown_switch() -> None:
    named = set(re.findall(r"`(VLLM_PRISM_[A-Z0-9_]+)`", DOC.read_text()))
    assert named <= set(envs.environment_variables), \
        sorted(named - set(envs.environment_variables))


def test_a_choice_switch_row_gives_its_default() -> None:
    """A switch with a fixed set of values (envs.CHOICES, the first its default) shows that
    default in its row."""
    rows = _table_rows()
    for name, values in envs.CHOICES.items():
        assert rows[name] == f"`{values[0]}`", (name, rows[name])
