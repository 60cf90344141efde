"""GradientMemory against specs/gradma.md §3.8-3.9 and §7 checks 20-22: mem_red, the D rows, the Gram."""
import random

import pytest
import torch

from rayfed.algorithms.memory import GradientMemory

BLOCKS = [(0, 4), (4, 5), (5, 23), (23, 37)]
DIM = 37


class ReferenceMemRed:
    """mem_red transcribed line by line from the §3.8 pseudocode, with plain dicts."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.buf = {}
        self.new_buf = set()

    def round(self, sampled):
        evicted = []
        for i in sampled:
            if i in self.buf:
                self.buf[i] += 1
            else:
                if len(self.buf) == self.capacity:
                    candidates = [k for k in self.buf if k not in sampled]
                    victim = candidates[0]
                    for k in candidates:
                        if self.buf[k] < self.buf[victim]:
                            victim = k
                    del self.buf[victim]
                    evicted.append(victim)
                self.buf[i] = 1
                self.new_buf.add(i)
        return evicted


def random_rounds(num_clients, sample_size, num_rounds, seed):
    rng = random.Random(seed)
    return [rng.sample(range(num_clients), sample_size) for _ in range(num_rounds)]


def random_uploads(sampled, generator, dtype=torch.float32):
    return {client: torch.randn(DIM, generator=generator, dtype=dtype) for client in sampled}


def test_worked_example():
    memory = GradientMemory(capacity=3, dim=2, beta2=0.5)
    expected = [  # sampled, evicted, buf after (client: c), new_buf
        ([0, 1], [], {0: 1, 1: 1}, {0, 1}),
        ([1, 2], [], {0: 1, 1: 2, 2: 1}, {2}),
        ([3, 0], [2], {0: 2, 1: 2, 3: 1}, {3}),
        ([4, 5], [3, 0], {1: 2, 4: 1, 5: 1}, {4, 5}),
    ]
    for sampled, evicted, buf, new_buf in expected:
        assert memory.admit(sampled) == evicted
        assert list(memory.counters.items()) == list(buf.items())     # order matters, not just contents
        assert memory.buffered == list(buf)
        assert memory.new_entrants == new_buf
        memory.update({client: torch.ones(2) for client in sampled})
        assert memory.new_entrants == set()


@pytest.mark.parametrize("num_clients,sample_size,capacity", [
    (6, 2, 3), (10, 3, 3), (10, 3, 10), (20, 5, 7), (30, 10, 12), (8, 1, 1), (8, 1, 2),
])
def test_mem_red_invariants(num_clients, sample_size, capacity):
    memory = GradientMemory(capacity=capacity, dim=1, beta2=0.9)
    reference = ReferenceMemRed(capacity)
    seen_evictions = 0
    for sampled in random_rounds(num_clients, sample_size, 2000, seed=num_clients * 100 + capacity):
        before = memory.counters
        evicted = memory.admit(sampled)
        after = memory.counters
        assert evicted == reference.round(sampled)
        assert list(after.items()) == list(reference.buf.items())
        assert memory.new_entrants == reference.new_buf
        reference.new_buf = set()

        assert len(after) <= capacity
        assert set(sampled) <= set(after)
        assert memory.new_entrants == {client for client in sampled if client not in before}
        assert not set(evicted) & set(sampled)
        # The candidates' counters do not change during the round, so the evictions are the
        # LFU-first, earliest-inserted-first prefix of buf \ S_t as it stood before mem_red.
        insertion = list(before)
        candidates = sorted((k for k in before if k not in sampled), key=lambda k: (before[k], insertion.index(k)))
        assert evicted == candidates[:len(evicted)]
        assert len(evicted) == max(0, len(before) + len(memory.new_entrants) - capacity)
        if capacity == num_clients:
            assert evicted == []
        seen_evictions += len(evicted)
        for client in sampled:
            assert after[client] == (before[client] + 1 if client in before else 1)

        memory.update({client: torch.ones(1) for client in sampled})
        assert memory.new_entrants == set()
        slots = [memory.slot_of(client) for client in memory.buffered]
        assert len(set(slots)) == len(slots) and all(0 <= slot < capacity for slot in slots)
        for client in evicted:
            with pytest.raises(KeyError):
                memory.slot_of(client)
        unused = [slot for slot in range(capacity) if slot not in slots]
        assert torch.count_nonzero(memory.rows[unused]) == 0
    assert (seen_evictions == 0) == (capacity == num_clients)


@pytest.mark.parametrize("dtype,rtol,atol", [(torch.float64, 1e-12, 1e-12), (torch.float32, 1e-5, 1e-5)])
@pytest.mark.parametrize("beta2", [0.0, 0.5, 0.9])
def test_rows_follow_closed_form_without_evictions(beta2, dtype, rtol, atol):
    """Check 20: with m = N, D[i] = sum over i's rounds k of beta2^(t-k) d_k^(i)."""
    num_clients = 7
    memory = GradientMemory(capacity=num_clients, dim=DIM, beta2=beta2, dtype=dtype)
    generator = torch.Generator().manual_seed(20)
    history = {client: [] for client in range(num_clients)}      # (round, upload) in float64
    for t, sampled in enumerate(random_rounds(num_clients, 3, 60, seed=20)):
        memory.admit(sampled)
        uploads = random_uploads(sampled, generator, dtype)
        memory.update(uploads)
        for client, upload in uploads.items():
            history[client].append((t, upload.double()))
        for client, rounds in history.items():
            if not rounds:
                assert client not in memory.buffered
                continue
            expected = sum(beta2 ** (t - k) * upload for k, upload in rounds)
            torch.testing.assert_close(memory.rows[memory.slot_of(client)].double(), expected, rtol=rtol, atol=atol)


def test_beta2_zero_leaves_only_this_rounds_uploads():
    memory = GradientMemory(capacity=6, dim=DIM, beta2=0.0)
    generator = torch.Generator().manual_seed(0)
    for sampled in random_rounds(8, 2, 50, seed=0):
        memory.admit(sampled)
        uploads = random_uploads(sampled, generator)
        memory.update(uploads)
        for client in memory.buffered:
            row = memory.rows[memory.slot_of(client)]
            assert torch.equal(row, uploads[client]) if client in uploads else not row.any()


def test_entering_clients_get_exactly_their_upload():
    """Check 22, re-entry after eviction included."""
    memory = GradientMemory(capacity=4, dim=DIM, beta2=0.9)
    generator = torch.Generator().manual_seed(22)
    ever_buffered, reentries = set(), 0
    for sampled in random_rounds(9, 3, 300, seed=22):
        memory.admit(sampled)
        entrants = memory.new_entrants
        reentries += len(entrants & ever_buffered)
        ever_buffered |= entrants
        uploads = random_uploads(sampled, generator)
        memory.update(uploads)
        for client in entrants:
            assert torch.equal(memory.rows[memory.slot_of(client)], uploads[client])
    assert reentries > 50


def relative_gram_error(gram, naive):
    """Largest |G - G_naive| over the Cauchy-Schwarz bound sqrt(G_ii G_jj): off-diagonal entries
    can cancel to near zero, so an entrywise relative error would be meaningless."""
    diagonal = naive.diagonal(dim1=-2, dim2=-1)
    scale = (diagonal.unsqueeze(-1) * diagonal.unsqueeze(-2)).sqrt()
    return float(((gram - naive).abs() / scale.clamp_min(1e-300)).max())


@pytest.mark.parametrize("blocks", [None, BLOCKS], ids=["model", "tensor"])
@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("beta2", [0.0, 0.5, 0.9])
def test_incremental_gram_matches_naive(beta2, dtype, rtol, blocks):
    memory = GradientMemory(capacity=5, dim=DIM, beta2=beta2, blocks=blocks, dtype=dtype)
    generator = torch.Generator().manual_seed(23)
    expected_shape = (5, 5) if blocks is None else (len(BLOCKS), 5, 5)
    evictions = 0
    for sampled in random_rounds(11, 3, 300, seed=23):
        evictions += len(memory.admit(sampled))
        # Between mem_red and Server_Update the slots of new entrants are empty, not stale.
        assert not memory.rows[[memory.slot_of(client) for client in memory.new_entrants]].any()
        assert relative_gram_error(memory.gram, memory.naive_gram()) <= rtol
        memory.update(random_uploads(sampled, generator, dtype))
        gram, naive = memory.gram, memory.naive_gram()
        assert gram.shape == naive.shape == expected_shape and gram.dtype == torch.float64
        assert relative_gram_error(gram, naive) <= rtol
        assert torch.equal(gram, gram.transpose(-1, -2))
    assert evictions > 100


@pytest.mark.parametrize("blocks", [None, BLOCKS], ids=["model", "tensor"])
@pytest.mark.parametrize("beta2", [0.1, 0.9])
def test_incremental_gram_follows_long_unsampled_rows(beta2, blocks):
    """Rows left unsampled for 400 rounds. At beta2 = 0.9 they shrink to 5e-19 and the Gram must
    shrink by the square of the float32 beta2 that multiplies them: beta2^2 itself drifts 2e-5 from
    the naive Gram, while the rows' own roundings only add up as a random walk (measured up to
    1.9e-6, on the one-coordinate block). At beta2 = 0.1 they pass through float32's subnormal
    range, where a decay no longer scales a row by beta2, to zero, and the Gram must follow."""
    memory = GradientMemory(capacity=4, dim=DIM, beta2=beta2, blocks=blocks)
    generator = torch.Generator().manual_seed(24)
    memory.admit([0, 1, 2, 3])
    memory.update(random_uploads([0, 1, 2, 3], generator))
    for _ in range(400):
        memory.admit([0])
        memory.update(random_uploads([0], generator))
        assert relative_gram_error(memory.gram, memory.naive_gram()) <= 5e-6
    stale = [memory.slot_of(client) for client in (1, 2, 3)]
    if beta2 == 0.1:
        assert not memory.rows[stale].any() and not memory.gram[..., stale, :].any()
    else:
        assert memory.rows[stale].abs().max() < 1e-17 and memory.rows[stale].all()


def test_same_calls_give_bitwise_same_state():
    def run():
        memory = GradientMemory(capacity=4, dim=DIM, beta2=0.9, blocks=BLOCKS)
        generator = torch.Generator().manual_seed(5)
        for sampled in random_rounds(9, 3, 40, seed=5):
            memory.admit(sampled)
            memory.update(random_uploads(sampled, generator))
        return memory
    first, second = run(), run()
    assert torch.equal(first.rows, second.rows) and torch.equal(first.gram, second.gram)
    assert first.buffered == second.buffered


def test_gram_is_a_copy():
    memory = GradientMemory(capacity=2, dim=3, beta2=0.5)
    memory.admit([0])
    memory.update({0: torch.ones(3)})
    memory.gram.add_(1.0)
    assert memory.gram[0, 0] == 3.0


def test_admit_rejects_more_clients_than_rows():
    memory = GradientMemory(capacity=3, dim=2, beta2=0.5)
    with pytest.raises(ValueError):
        memory.admit([0, 1, 2, 3])
    with pytest.raises(ValueError):
        memory.admit([0, 0])
    with pytest.raises(ValueError):
        GradientMemory(capacity=0, dim=2, beta2=0.5)


@pytest.mark.parametrize("clients", [[0], [0, 1, 2], [0, 2]])
def test_update_rejects_other_clients_than_admitted(clients):
    memory = GradientMemory(capacity=3, dim=2, beta2=0.5)
    memory.admit([0, 1])
    with pytest.raises(ValueError):
        memory.update({client: torch.ones(2) for client in clients})


def test_update_rejects_wrong_shape_and_missing_admit():
    memory = GradientMemory(capacity=3, dim=2, beta2=0.5)
    with pytest.raises(ValueError):
        memory.update({0: torch.ones(2)})
    memory.admit([0])
    with pytest.raises(RuntimeError):
        memory.admit([1])
    with pytest.raises(ValueError):
        memory.update({0: torch.ones(3)})


def test_empty_round_only_decays():
    memory = GradientMemory(capacity=3, dim=2, beta2=0.5)
    memory.admit([0])
    memory.update({0: torch.tensor([2.0, 4.0])})
    memory.admit([])
    memory.update({})
    assert torch.equal(memory.rows[memory.slot_of(0)], torch.tensor([1.0, 2.0]))
    assert torch.equal(memory.gram, memory.naive_gram())
