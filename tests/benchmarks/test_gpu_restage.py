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


def test_parts_fit_beside_the_tree(tmp_path: Path) -> None:
    stream = os.urandom(150 * MIB)
    repo = _staged_repo(tmp_path, 30 * MIB, stream, 60 * MIB)  # 3 parts of <= 60 MiB
    out = subprocess.run(["bash", str(SCRIPT)], cwd=repo, check=True, capture_output=True,
                         text=True).stdout
    parts = sorted((repo / ".gpu-stage").iterdir())
    sizes = [(p / f"stage.tar.{p.name[-2:]}").stat().st_size for p in parts]
    # 56 MiB less the 30 MiB tree: 26 MiB parts, so 6 of them
    assert len(parts) == 6 and max(sizes) <= 26 * MIB
    assert b"".join((p / f"stage.tar.{p.name[-2:]}").read_bytes() for p in parts) == stream
    assert {(p / "parts").read_text().strip() for p in parts} == {"6"}
    assert all((p / "device-stage.sh").is_file() for p in parts)
    assert out.count("run  carry=") == 6


def test_no_room_is_refused(tmp_path: Path) -> None:
    repo = _staged_repo(tmp_path, 50 * MIB, b"y" * MIB, MIB)
    run = subprocess.run(["bash", str(SCRIPT)], cwd=repo, capture_output=True, text=True)
    assert run.returncode != 0 and "no room" in run.stderr
    assert (repo / ".gpu-stage" / "part-00" / "stage.tar.00").read_bytes() == b"y" * MIB
