"""The vllm.general_plugins entry point: declared, importable without a GPU, idempotent."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points


def test_entry_point_is_declared() -> None:
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "prism"]
    assert len(eps) == 1
    assert eps[0].value == "vllm_prism:register"


def test_import_is_cheap() -> None:
    """Importing the package must not import vLLM or torch (vLLM imports it everywhere)."""
    code = ("import sys, vllm_prism; "
            "print(any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), "
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


def test_register_is_idempotent(monkeypatch) -> None:
    import vllm_prism
    from vllm_prism import _registry

    calls = []
    monkeypatch.setattr(vllm_prism, "_registered", False)
    monkeypatch.setattr(_registry, "REGISTRATIONS", [lambda: calls.append(1)])
    vllm_prism.register()
    vllm_prism.register()
    assert calls == [1]
    assert vllm_prism.is_registered()


def test_vllm_loads_the_plugin() -> None:
    """vLLM's own plugin loader finds and runs our entry point."""
    code = ("from vllm.plugins import load_general_plugins; load_general_plugins(); "
            "import vllm_prism; print(vllm_prism.is_registered())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "True"


def test_our_log_lines_reach_vllms_handler() -> None:
    """vLLM configures only its own logger; after the plugin loads, a vllm_prism logger's
    INFO line is printed by vLLM's handler."""
    code = ("from vllm.plugins import load_general_plugins; load_general_plugins(); "
            "from vllm.logger import _configure_vllm_root_logger as c; c(); "  # as an engine does
            "import logging; logging.getLogger('vllm_prism.x').info('prism-log-probe')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "prism-log-probe" in res.stdout + res.stderr
