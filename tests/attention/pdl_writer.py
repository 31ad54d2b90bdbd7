"""A slow cache writer for the programmatic-dependent-launch test: a Triton kernel that lets
the next kernel launch at once (``griddepcontrol.launch_dependents``), spins, and only then
writes its rows, so that a dependent kernel that read those rows before its
``griddepcontrol.wait`` would see the old bytes. Imported by GPU tests only."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _slow_copy_rows(dst_ptr, src_ptr, off_ptr, spin_ptr, n_spin, ROW: tl.constexpr,
                    BLOCK: tl.constexpr):
    tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    acc = tl.load(spin_ptr + pid)
    for _ in range(n_spin):
        acc = acc * 0.999 + 1.0
    tl.store(spin_ptr + pid, acc)
    off = tl.load(off_ptr + pid)
    for c in range(0, ROW, BLOCK):
        i = c + tl.arange(0, BLOCK)
        m = i < ROW
        tl.store(dst_ptr + off + i, tl.load(src_ptr + off + i, mask=m), mask=m)


def slow_copy_slots(dst: torch.Tensor, src: torch.Tensor, byte_offsets: torch.Tensor,
                    row_bytes: int, n_spin: int = 200_000) -> None:
    """Copy ``row_bytes`` bytes at each of ``byte_offsets`` (int64, from the start of both
    int8 tensors, which share a layout) from ``src`` to ``dst`` after a spin of ``n_spin``
    dependent multiply-adds per row."""
    spin = torch.zeros(byte_offsets.numel(), dtype=torch.float32, device=dst.device)
    _slow_copy_rows[(byte_offsets.numel(),)](dst, src, byte_offsets, spin, n_spin,
                                             ROW=row_bytes, BLOCK=1024)
