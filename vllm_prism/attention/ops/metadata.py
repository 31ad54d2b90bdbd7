"""Per-batch attention metadata, shaped like vLLM's ``CommonAttentionMetadata``.

Requests are laid out as vLLM lays them out: the query tokens of request ``r`` are rows
``query_start_loc[r] : query_start_loc[r + 1]`` of ``q``; ``seq_lens[r]`` counts every token of
the request *including* this step's query tokens (whose K/V are already in the cache, as vLLM
writes the cache before attention); the query tokens are the last ``q_len`` positions, and a
query token at position ``p`` attends to cached positions ``0..p``. ``block_table[r, i]`` is the
physical block holding positions ``i * block_size .. (i + 1) * block_size - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["AttentionMetadata"]


@dataclass
class AttentionMetadata:
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    max_query_len: int
    max_seq_len: int
    # Host copies (optional): routing in mixed batches and the prefill path read them; each
    # is built on demand (one device sync) when absent, and only when read.
    query_start_loc_cpu: torch.Tensor | None = None
    seq_lens_cpu: torch.Tensor | None = None
    _qsl_host: list[int] | None = field(default=None, repr=False)
    _sl_host: list[int] | None = field(default=None, repr=False)

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return int(self.host_query_start_loc()[-1])

    def host_query_start_loc(self) -> list[int]:
        """``query_start_loc`` as a Python list (from its host copy where there is one)."""
        if self._qsl_host is None:
            qsl = self.query_start_loc_cpu
            self._qsl_host = (self.query_start_loc.cpu() if qsl is None else qsl).tolist()
        return self._qsl_host

    def host_seq_lens(self) -> list[int]:
        """``seq_lens`` as a Python list (from its host copy where there is one)."""
        if self._sl_host is None:
            sl = self.seq_lens_cpu
            self._sl_host = (self.seq_lens.cpu() if sl is None else sl).tolist()
        return self._sl_host

    def host(self) -> tuple[list[int], list[int]]:
        """(query_start_loc, seq_lens) as Python lists."""
        return self.host_query_start_loc(), self.host_seq_lens()

    def query_lens(self) -> list[int]:
        """Query tokens per request, from the host ``query_start_loc`` alone (the backend's
        builder routes every step with it: no device sync where vLLM gave its host copy)."""
        qsl = self.host_query_start_loc()
        return [qsl[i + 1] - qsl[i] for i in range(len(qsl) - 1)]

    @classmethod
    def build(cls, block_table: torch.Tensor, seq_lens: list[int], query_lens: list[int],
              device: torch.device | str | None = None) -> AttentionMetadata:
        """Metadata from Python lists (tests, benchmarks, eager callers)."""
        if len(seq_lens) != len(query_lens):
            raise ValueError("seq_lens and query_lens differ in length")
        for s, q in zip(seq_lens, query_lens):
            if q < 1 or q > s:
                raise ValueError(f"query length {q} must be in 1..seq_len ({s})")
        device = block_table.device if device is None else torch.device(device)
        qsl = [0]
        for q in query_lens:
            qsl.append(qsl[-1] + q)
        qsl_cpu = torch.tensor(qsl, dtype=torch.int32)
        sl_cpu = torch.tensor(seq_lens, dtype=torch.int32)
        return cls(block_table=block_table.to(device=device, dtype=torch.int32),
                   seq_lens=sl_cpu.to(device), query_start_loc=qsl_cpu.to(device),
                   max_query_len=max(query_lens), max_seq_len=max(seq_lens),
                   query_start_loc_cpu=qsl_cpu, seq_lens_cpu=sl_cpu)
