"""scripts/gpu-restage.sh: the vLLM staging parts cut again so that each fits in one device
call beside the tree, the joined stream unchanged and every part told the new count."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-restage.sh"
MIB = 1 << 20


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _staged_repo(tmp_path: Path, tracked_bytes: int, stream: bytes, part: int) -> Path:
    """A git checkout with ``tracked_bytes`` of tracked files and .gpu-stage/ holding
    ``stream`` in parts of ``part`` bytes, as prepare.sh leaves it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "big.bin").write_bytes(b"x" * tracked_bytes)
    (repo / ".gitignore").write_text("/.gpu-stage/\n")
    _git(repo, "add", "-A")
    pieces = [stream[i:i + part] for i in range(0, len(stream), part)]
    for n, piece in enumerate(pieces):
        d = repo / ".gpu-stage" / f"part-{n:02d}"
        d.mkdir(parents=True)
        (d / f"stage.tar.{n:02d}").write_bytes(piece)
        (d / "device-stage.sh").write_text("#!/bin/sh\necho staged\n")
        (d / "parts").write_text(f"{len(pieces)}\n")
    return repo


def _restage(repo: Path, budget_mib: int) -> subprocess.CompletedProcess:
    # the call's budget scaled down (the script's default is 56 MiB), so the test writes
    # tens of MiB, not hundreds
    env = dict(os.environ, PRISM_STAGE_BUDGET_MIB=str(budget_mib))
    return subprocess.run(["bash", str(SCRIPT)], cwd=repo, capture_output=True, text=True,
                          env=env)


def test_parts_fit_beside_the_tree(tmp_path: Path) -> None:
    stream = os.urandom(27 * MIB)
    repo = _staged_repo(tmp_path, 4 * MIB, stream, 12 * MIB)  # 3 parts of <= 12 MiB
    run = _restage(repo, 14)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    parts = sorted((repo / ".gpu-stage").iterdir())
    sizes = [(p / f"stage.tar.{p.name[-2:]}").stat().st_size for p in parts]
    # 14 MiB less the 4 MiB tree (and its .gitignore): parts just under 10 MiB, so 3 of them
    assert len(parts) == 3 and max(sizes) <= 10 * MIB
    assert b"".join((p / f"stage.tar.{p.name[-2:]}").read_bytes() for p in parts) == stream
    assert {(p / "parts").read_text().strip() for p in parts} == {"3"}
    assert all((p / "device-stage.sh").is_file() for p in parts)
    assert out.count("run  carry=") == 3


def test_no_room_is_refused(tmp_path: Path) -> None:
    repo = _staged_repo(tmp_path, 7 * MIB, b"y" * MIB, MIB)  # 14 - 7 MiB: below 8 MiB a part
    run = _restage(repo, 14)
    assert run.returncode != 0 and "no room" in run.stderr
    assert (repo / ".gpu-stage" / "part-00" / "stage.tar.00").read_bytes() == b"y" * MIB
