"""GradMA's server memory (Luo et al., CVPR 2023, arXiv:2302.14307): mem_red (Alg. 4) and the decayed rows D
(Alg. 3).

D is one preallocated (capacity, d) matrix rather than a map of tensors, so the server QP
gets its constraint matrix without a gather and a decay is one in-place op. The Gram matrix
of D, which the QP needs every round, is kept incrementally: rows of clients that were not
sampled only shrink by beta2, so their inner products shrink by beta2^2 and only the S
sampled rows (and rows fading through the subnormal range) need fresh O(capacity * d) products.
"""
from __future__ import annotations

import heapq
import sys
from typing import Sequence

import torch
from torch import Tensor

from rayfed.numerics import block_dot64


class GradientMemory:
    """mem_red's counters and insertion-ordered buffer, and the decayed memory D.

    Client k's row lives in slot `slot_of(k)` of `rows`; an evicted client's slot is zeroed
    and handed to a later entrant. Each round is `admit(sampled)` before local training, then
    `update(uploads)` with exactly those clients' uploads.
    """

    def __init__(self, capacity: int, dim: int, beta2: float, *, blocks: Sequence[tuple[int, int]] | None = None,
                 device="cpu", dtype=torch.float32):
        if capacity < 1:
            raise ValueError(f"memory capacity must be >= 1 (m = 0 means no memory at all), got {capacity}")
        self.capacity = capacity
        self.dim = dim
        self.beta2 = beta2
        # The rows can only be multiplied by beta2 rounded to their dtype, and the Gram must shrink
        # by the square of that factor, not of beta2, or it drifts from the naive Gram by twice the
        # rounding of beta2 per round (3e-8 for 0.1 in float32: 1e-6 after 30 rounds).
        self._decay = float(torch.tensor(beta2, dtype=dtype))
        self._per_block = blocks is not None
        # The whole model is the single block [0, d), so one code path serves both QP scopes.
        self._blocks = list(blocks) if self._per_block else [(0, dim)]
        self._rows = torch.zeros(capacity, dim, device=device, dtype=dtype)
        self._gram = torch.zeros(len(self._blocks), capacity, capacity, device=device, dtype=torch.float64)
        # Squared norm of a block of `size` entries under which subnormal roundings dominate
        # (_refresh_gram). 0 for float64 rows: tiny^2 underflows, as their Gram entries would first.
        tiny = torch.finfo(dtype).tiny
        self._subnormal_norms2 = torch.tensor([(stop - start) * tiny * tiny for start, stop in self._blocks],
                                              device=device, dtype=torch.float64)[:, None]
        self._counters: dict[int, int] = {}     # buf: client -> c(client); dict order is insertion order
        self._slots: dict[int, int] = {}
        # Lowest free slot first, so slot assignment depends only on the call sequence.
        self._free_slots = list(range(capacity))
        self._new_entrants: set[int] = set()
        self._round_clients: set[int] | None = None     # set by admit(), consumed by update()

    def admit(self, sampled: Sequence[int]) -> list[int]:
        """mem_red for this round's sampled clients, in sampling order (before local training).
        Returns the clients evicted this round, in eviction order."""
        if self._round_clients is not None:
            raise RuntimeError("admit() called twice without update() in between")
        round_clients = set(sampled)
        if len(round_clients) != len(sampled):
            raise ValueError(f"sampled clients must be distinct, got {list(sampled)}")
        if len(round_clients) > self.capacity:
            raise ValueError(f"{len(round_clients)} sampled clients do not fit a memory of {self.capacity} rows")
        evicted = []
        for client in sampled:
            if client in self._counters:
                self._counters[client] += 1
                continue
            if len(self._counters) == self.capacity:
                # min() returns the first minimum in dict order: LFU, ties to the earliest inserted (A11).
                victim = min((k for k in self._counters if k not in round_clients), key=self._counters.__getitem__)
                self._free(victim)
                evicted.append(victim)
            self._counters[client] = 1
            self._slots[client] = heapq.heappop(self._free_slots)
            self._new_entrants.add(client)
        self._round_clients = round_clients
        return evicted

    def _free(self, client: int) -> None:
        """Discards the client's history entirely (Alg. 4: evicted rows are not merged anywhere)."""
        del self._counters[client]
        slot = self._slots.pop(client)
        self._rows[slot].zero_()
        self._gram[:, slot, :] = 0
        self._gram[:, :, slot] = 0
        heapq.heappush(self._free_slots, slot)

    def update(self, updates: dict[int, Tensor]) -> None:
        """Server_Update's memory part: D[k] = d_k for new entrants, beta2 D[k] + d_k for the
        other sampled clients, beta2 D[k] for the buffered clients not sampled; ends the round."""
        if self._round_clients is None or set(updates) != self._round_clients:
            raise ValueError(f"update() needs the uploads of exactly the clients admitted this round "
                             f"({sorted(self._round_clients or ())}), got {sorted(updates)}")
        for client, upload in updates.items():
            if upload.shape != (self.dim,):
                raise ValueError(f"client {client}'s upload has shape {tuple(upload.shape)}, expected ({self.dim},)")
        # Free slots are zero, so decaying every row at once is exact for them too.
        self._rows.mul_(self._decay)
        for client, upload in updates.items():
            row = self._rows[self._slots[client]]
            upload = upload.to(row.device)
            if client in self._new_entrants:
                row.copy_(upload)       # overwrite: no stale history, even for a re-entering client
            else:
                row.add_(upload)
        self._refresh_gram(sorted(self._slots[client] for client in updates))
        self._new_entrants.clear()
        self._round_clients = None

    def _refresh_gram(self, touched_slots: list[int]) -> None:
        self._gram.mul_(self._decay ** 2)
        # Decaying a subnormal entry rounds it by up to half the smallest subnormal, not relatively,
        # and finally flushes it to zero: a row left unsampled long enough (at beta2 = 0.1, about
        # 38 rounds for float32 entries of order 1) no longer shrinks by beta2, and scaled products
        # would give the QP a constraint that D does not hold (the QP keeps rows of any norm). Once
        # a block's norm is below sqrt(size) * tiny, those roundings outweigh the relative ones of a
        # normal row, so the row gets fresh products every round until it is exactly zero.
        diagonal = self._gram.diagonal(dim1=1, dim2=2)
        fading = ((diagonal > 0) & (diagonal < self._subnormal_norms2)).any(0).nonzero()[:, 0].tolist()
        touched_slots = sorted(set(touched_slots).union(fading))
        touched = torch.tensor(touched_slots, dtype=torch.long, device=self._rows.device)
        fresh = block_dot64(self._rows[touched], self._rows, self._blocks)      # (blocks, S, capacity)
        self._gram[:, touched, :] = fresh
        self._gram[:, :, touched] = fresh.transpose(1, 2)
        # The touched-by-touched products were computed twice, as (a, b) and (b, a), possibly
        # differing in the last bit; averaging keeps the Gram exactly symmetric.
        among_touched = fresh[:, :, touched]
        self._gram[:, touched[:, None], touched] = (among_touched + among_touched.transpose(1, 2)) / 2

    @property
    def rows(self) -> Tensor:
        """The (capacity, d) slot matrix D itself, not a copy; unused slots are exactly zero.
        Callers must not modify it."""
        return self._rows

    @property
    def gram(self) -> Tensor:
        """(capacity, capacity) float64 Gram of `rows`, or (blocks, capacity, capacity) per block.
        A copy, so that a caller adding a ridge in place cannot corrupt the incremental state."""
        return self._gram.clone() if self._per_block else self._gram[0].clone()

    def naive_gram(self) -> Tensor:
        """`gram` recomputed from scratch, O(capacity^2 d): the reference for tests and benchmarks."""
        gram = block_dot64(self._rows, self._rows, self._blocks)
        return gram if self._per_block else gram[0]

    @property
    def buffered(self) -> list[int]:
        """Clients with a row, in insertion order."""
        return list(self._counters)

    @property
    def counters(self) -> dict[int, int]:
        """c(k) for the buffered clients, in insertion order; every other client's counter is 0."""
        return dict(self._counters)

    @property
    def new_entrants(self) -> set[int]:
        """Clients that entered the buffer in the current round; empty between update() and admit()."""
        return set(self._new_entrants)

    def slot_of(self, client: int) -> int:
        """The row of `rows` holding the client's memory; KeyError if the client is not buffered."""
        return self._slots[client]

    @property
    def nbytes(self) -> int:
        tensors = self._rows.numel() * self._rows.element_size() + self._gram.numel() * self._gram.element_size()
        bookkeeping = sum(sys.getsizeof(container) for container in
                          (self._counters, self._slots, self._free_slots, self._new_entrants))
        return tensors + bookkeeping
