"""A model of the warpgroup-MMA verification kernel's stage ring (csrc/attention/
int8_verify_wgmma.cu), run on the CPU: one producer fills kRing shared buffers in the ring's
order, two consumer warpgroups take the stages in turn (stage k is consumer k % 2's), each
buffer has a full and an empty mbarrier, and every wait is a parity wait as the hardware's
(`mbarrier.try_wait.parity` passes where the barrier's current phase has the other parity, so
it cannot tell the phase it means from the one before that).

With an odd ring a buffer's rounds alternate between the consumers, so a consumer's wait for
round r + 1 of a buffer is not preceded by its own wait for round r. Copies that land in the
order they were issued (the cp.async producer: each lane's arrival waits for all its earlier
copies) keep that safe; TMA boxes land in any order, and a consumer can then pass its parity
wait while the buffer still holds the stage kRing before, half written (the H100 run of the
thirty-eighth session: an unspecified launch failure at 40K and hangs). The kernel's rule, a
TMA stage issued only once stage k - kTmaLag has landed (kTmaLag = kRing - 2), restores it.

The model reads kRing and kTmaLag from the kernel's source, so a change to either that breaks
the protocol fails here; random schedules (which agent moves, which copy lands) search for a
wait that passes on the wrong phase, a copy into a buffer a consumer still reads, or a
deadlock."""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "csrc" / "attention" / "int8_verify_wgmma.cu"


def _kernel_constants() -> tuple[list[int], str]:
    """The ring sizes (one per head size) and the lag expression of the kernel's source."""
    text = SRC.read_text()
    ring = re.search(r"kRing\s*=\s*HD\s*==\s*256\s*\?\s*(\d+)\s*:\s*(\d+)\s*;", text)
    lag = re.search(r"kTmaLag\s*=\s*([^;]+);", text)
    assert ring and lag, "kRing / kTmaLag not found in " + str(SRC)
    return [int(ring.group(1)), int(ring.group(2))], lag.group(1).strip()


def _lag_of(expr: str, ring: int) -> int:
    assert re.fullmatch(r"kRing\s*-\s*\d+|\d+", expr), expr
    return eval(expr, {"kRing": ring})  # noqa: S307 - an integer expression of kRing


@dataclass
class Barrier:
    """An mbarrier: `count` arrivals and no pending transaction bytes complete a phase."""
    count: int
    phase: int = 0
    pending: int = 0
    tx: int = 0

    def __post_init__(self) -> None:
        self.pending = self.count

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, expect_tx: int = 0) -> None:
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, n: int) -> None:
        self.tx -= n
        self._maybe_complete()

    def passes(self, parity: int) -> bool:
        """try_wait.parity: true where the current phase's parity is not `parity`."""
        return (self.phase & 1) != parity


@dataclass
class Ring:
    ring: int
    stages: tuple[int, int]  # each consumer's stages with data (the rest: only arrivals)
    n_max: int
    in_order: bool  # copies land in issue order (cp.async) or in any order (TMA)
    lag: int | None  # TMA: stage k issued only after stage k - lag landed
    full: list[Barrier] = field(default_factory=list)
    empty: list[Barrier] = field(default_factory=list)
    content: list[int] = field(default_factory=list)
    flying: list[tuple[int, int]] = field(default_factory=list)  # (stage, buffer) in flight
    held: dict[int, int] = field(default_factory=dict)  # consumer -> buffer it reads
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.full = [Barrier(1) for _ in range(self.ring)]
        self.empty = [Barrier(1) for _ in range(self.ring)]
        self.content = [-1] * self.ring
        self.k_prod = 0
        self.st = [0, 0]

    def has_data(self, k: int) -> bool:
        return k // 2 < self.stages[k % 2]

    # ---- the producer: stage k_prod in the ring's order
    def producer_step(self) -> bool:
        k = self.k_prod
        if k >= 2 * self.n_max:
            return False
        buf, rnd = k % self.ring, k // self.ring
        if rnd > 0 and not self.empty[buf].passes((rnd - 1) & 1):
            return False
        if self.lag is not None and k >= self.lag:
            j = k - self.lag
            if not self.full[j % self.ring].passes((j // self.ring) & 1):
                return False
        if self.has_data(k) and buf in self.held.values():
            self.errors.append(f"stage {k} copied into buffer {buf} while a consumer reads it")
        if self.in_order:  # cp.async: the arrival itself waits for every earlier copy
            self.flying.append((k, buf))
        elif self.has_data(k):  # TMA: the arrival carries the bytes, the box lands later
            self.full[buf].arrive(expect_tx=1)
            self.flying.append((k, buf))
        else:  # TMA, a stage past the segment's end: the arrival alone, at once
            self.full[buf].arrive()
        self.k_prod += 1
        return True

    def land(self, i: int) -> None:
        k, buf = self.flying.pop(i)
        if self.has_data(k):
            self.content[buf] = k
        if self.in_order:
            self.full[buf].arrive()
        else:
            self.full[buf].complete_tx(1)

    # ---- consumer c: its stage st (the ring's stage 2 st + c)
    def consumer_step(self, c: int) -> bool:
        if c in self.held:  # done with the stage: the buffer goes back
            self.empty[self.held.pop(c)].arrive()
            self.st[c] += 1
            return True
        if self.st[c] >= self.n_max:
            return False
        k = 2 * self.st[c] + c
        buf, rnd = k % self.ring, k // self.ring
        if not self.full[buf].passes(rnd & 1):
            return False
        if self.full[buf].phase != rnd + 1:
            self.errors.append(f"consumer {c} passed its wait for stage {k} (round {rnd} of "
                               f"buffer {buf}) in phase {self.full[buf].phase}")
        if self.has_data(k):
            if self.content[buf] != k or any(b == buf for _, b in self.flying if _ <= k):
                self.errors.append(f"consumer {c} read stage {k} from buffer {buf} holding "
                                   f"stage {self.content[buf]}")
            self.held[c] = buf
        else:
            self.empty[buf].arrive()
            self.st[c] += 1
        return True

    def done(self) -> bool:
        return self.k_prod >= 2 * self.n_max and self.st == [self.n_max, self.n_max]

    # ---- after the loops: the consumers write their outputs from registers and the CTA
    # exits; its shared memory must outlive every copy into it, so no stage with data may still
    # be in flight once both consumers are past their loops
    def check_exit(self) -> None:
        late = [k for k, _ in self.flying if self.has_data(k)]
        if late and self.st == [self.n_max, self.n_max] and not self.held:
            self.errors.append(f"both consumers past their loops while stage {late[0]} is "
                               "still in flight")


def run_ring(ring: int, lag: int | None, in_order: bool, seed: int) -> list[str]:
    """One random schedule; the protocol violations it met (empty: none)."""
    rng = random.Random(seed)
    n_max = rng.randint(2, 14)
    stages = (n_max, rng.choice([n_max, rng.randint(0, n_max), 0]))
    if rng.random() < 0.5:
        stages = stages[::-1]
    m = Ring(ring, stages, n_max, in_order, lag)
    for _ in range(10_000):
        if m.errors or m.done():
            break
        moves = [("p", 0), ("c", 0), ("c", 1)]
        if m.flying:
            moves.append(("land", 0 if in_order else rng.randrange(len(m.flying))))
        rng.shuffle(moves)
        for kind, arg in moves:
            if kind == "land":
                m.land(arg)
                break
            if (m.producer_step() if kind == "p" else m.consumer_step(arg)):
                break
        else:
            m.errors.append(f"deadlock: producer at {m.k_prod}, consumers at {m.st}")
        m.check_exit()
    return m.errors


def _violations(ring: int, lag: int | None, in_order: bool, seeds: int = 400) -> list[str]:
    out: list[str] = []
    for s in range(seeds):
        out += run_ring(ring, lag, in_order, s)
    return out


RINGS, LAG_EXPR = _kernel_constants()


@pytest.mark.parametrize("ring", RINGS)
def test_tma_ring_with_the_kernels_lag_is_safe(ring):
    """The kernel's rings with its TMA lag: no wait passes on the wrong phase, no stage is
    read before it lands or overwritten while read, no deadlock, over random schedules."""
    lag = _lag_of(LAG_EXPR, ring)
    assert _violations(ring, lag, in_order=False) == []


@pytest.mark.parametrize("ring", RINGS)
def test_cp_async_ring_is_safe(ring):
    """Copies landing in issue order (the cp.async producer) need no lag."""
    assert _violations(ring, None, in_order=True) == []


def test_odd_ring_without_the_lag_breaks():
    """The failure the lag prevents: TMA boxes landing out of order on the 5-buffer ring let
    a consumer pass its parity wait on the buffer's previous round (so the model can fail)."""
    errs = _violations(5, None, in_order=False)
    assert any("passed its wait" in e or "read stage" in e for e in errs), errs[:3]


def test_lag_one_more_than_the_rule_breaks():
    """kTmaLag = kRing - 2 is the largest safe lag on the odd ring: one more already lets a
    consumer pass on the wrong phase."""
    assert _violations(5, 4, in_order=False) != []


def test_exit_check_can_fail():
    """The check behind the CTA's exit (run by every schedule above): a copy with data still in
    flight once both loops are done is a violation; a stage with no data is not."""
    m = Ring(5, (2, 2), 2, in_order=False, lag=3)
    m.st, m.flying = [2, 2], [(3, 3)]
    m.check_exit()
    assert m.errors and "still in flight" in m.errors[0]
    clear = Ring(5, (2, 0), 2, in_order=False, lag=3)
    clear.st, clear.flying = [2, 0], [(3, 3)]  # consumer 1's stage: no data, nothing lands
    clear.check_exit()
    assert clear.errors == []
