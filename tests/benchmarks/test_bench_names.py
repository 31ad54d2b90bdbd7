"""Every global name the functions of a benchmark script or of a GPU test module read exists
once the module is imported: their GPU-only paths (a tile sweep, a prefill sweep, every GPU
test) run nowhere in CI, so a table removed by a refactor (bench_pq2_linear.py's GEMM_CONFIGS,
2026-12-01 to 2026-12-02) only showed as a NameError on the GPU. Read from the compiled code's
symbol tables, so no GPU is needed."""

from __future__ import annotations

import builtins
import importlib.util
import symtable
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*(ROOT / "benchmarks" / "kernels").glob("*.py"),
                  *(ROOT / "benchmarks" / "e2e").glob("*.py"),
                  *(ROOT / "benchmarks" / "quality").glob("*.py"),
                  # the GPU tests (their module's or a test's gpu mark)
                  *(p for p in (ROOT / "tests").glob("**/test_*.py")
                    if "mark.gpu" in p.read_text())])


def _global_reads(table: symtable.SymbolTable) -> set[str]:
    """Names the functions (and classes, comprehensions) under ``table`` read as globals."""
    names: set[str] = set()
    for child in table.get_children():
        for sym in child.get_symbols():
            if sym.is_referenced() and sym.is_global() and not sym.is_assigned():
                names.add(sym.get_name())
        names |= _global_reads(child)
    return names


def _import(path: Path):
    """The module at ``path``: the one already imported (pytest's, for a collected test
    module: no module runs twice), else a test module as a package under tests/ (its folder's
    helpers on the path), a script under a name of its own."""
    for mod in list(sys.modules.values()):
        if getattr(mod, "__file__", None) and Path(mod.__file__).resolve() == path.resolve():
            return mod
    paths = [str(path.parent), str(ROOT / "tests"), str(ROOT)]
    sys.path[:0] = paths
    try:
        if path.is_relative_to(ROOT / "tests"):
            return importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        del sys.path[:len(paths)]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_global_a_function_reads_exists(path: Path) -> None:
    table = symtable.symtable(path.read_text(), str(path), "exec")
    mod = _import(path)
    missing = sorted(n for n in _global_reads(table)
                     if not hasattr(mod, n) and not hasattr(builtins, n))
    assert not missing, f"{path.name} reads undefined globals: {missing}"


def test_the_check_sees_an_undefined_table() -> None:
    """The check itself: a function that reads a table nobody defines is reported."""
    table = symtable.symtable("X = 1\ndef f():\n    return X + TABLE['a']\n", "t.py", "exec")
    assert _global_reads(table) == {"X", "TABLE"}
