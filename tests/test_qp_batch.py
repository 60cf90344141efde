"""cone_project_batch: a stack of projections (engine.vectorize's clients) equals cone_project_blocks
client by client, bit for bit, and the stacked diagnostics equal each client's QPInfo."""
import math

import numpy as np
import pytest
import torch

from rayfed.qp import QPInfo, cone_project, cone_project_batch, cone_project_blocks
from tests.test_qp import degenerate_instances, instance, random_blocks

CLIENTS = 7


def stack(seed, d, rows, dtype=torch.float32):
    """CLIENTS instances of one shape, from independent seeds: some feasible, some not."""
    pairs = [instance(seed * 100 + client, d=d, rows=rows, dtype=dtype) for client in range(CLIENTS)]
    p, M = torch.stack([pair[0] for pair in pairs]), torch.stack([pair[1] for pair in pairs])
    M[1] = M[1] * torch.where(M[1] @ p[1] >= 0, 1.0, -1.0)[:, None]     # already feasible: the fast path
    return p, M


def assert_each_client_alone(p, M, blocks=None, **options):
    given = p.clone(), M.clone()
    ptilde, stats = cone_project_batch(p, M, blocks, **options)
    assert torch.equal(p.view(torch.int8), given[0].view(torch.int8))          # the inputs are left as they were
    assert torch.equal(M.view(torch.int8), given[1].view(torch.int8))
    infos = stats.infos()
    assert ptilde.shape == p.shape and ptilde.dtype == p.dtype and len(infos) == p.shape[0]
    for client in range(p.shape[0]):
        alone, info = (cone_project(p[client], M[client], **options) if blocks is None else
                       cone_project_blocks(p[client], M[client], blocks, **options))
        assert torch.equal(ptilde[client].view(torch.int32 if p.dtype == torch.float32 else torch.int64),
                           alone.view(torch.int32 if p.dtype == torch.float32 else torch.int64)), client
        assert same_info(infos[client], info), (client, infos[client], info)
    return ptilde, infos


def same_info(left: QPInfo, right: QPInfo) -> bool:
    """Equal fields, nan equal to nan."""
    return (left.active, left.relative_change, left.failed) == (right.active, right.relative_change, right.failed) and (
        left.min_cosine == right.min_cosine or (math.isnan(left.min_cosine) and math.isnan(right.min_cosine)))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize("margin", [0.0, 0.2])
def test_stack_equals_each_client_alone(seed, rows, margin):
    p, M = stack(seed, d=int(np.random.default_rng(seed).integers(2, 300)), rows=rows)
    _, infos = assert_each_client_alone(p, M, margin=margin)
    assert any(info.active for info in infos) and not any(info.failed for info in infos)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rows", [3, 4])
def test_stack_per_block_equals_each_client_alone(seed, rows):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(20, 200))
    p, M = stack(50 + seed, d=d, rows=rows)
    M[2, 2, :d // 2] = 0.0                                  # an a3-like row that is zero in some blocks
    blocks = [(0, 1), (1, 3)] + random_blocks(rng, 3, d, int(rng.integers(1, 8)))
    assert_each_client_alone(p, M, blocks, margin=0.1 * (seed % 2))


def test_chunks_of_columns_do_not_depend_on_the_stack():
    """Above one chunk of float64 columns (65536 for four rows) the sums run chunk by chunk."""
    p, M = stack(70, d=150_001, rows=3)
    assert_each_client_alone(p, M)
    assert_each_client_alone(p, M, [(0, 70_000), (70_000, 70_010), (70_010, 150_001)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_degenerate_instances_in_one_stack(dtype):
    """Dependent, duplicated, zero and antiparallel rows and p in the polar cone, side by side, with
    the solvers' choices (enumeration for C <= 3, cvxopt above) the same as alone."""
    by_rows = {}
    for name, (p, M) in degenerate_instances().items():
        if M.shape[1] == 40:
            by_rows.setdefault(M.shape[0], []).append((torch.tensor(p, dtype=dtype), torch.tensor(M, dtype=dtype)))
    for pairs in by_rows.values():
        p, M = torch.stack([pair[0] for pair in pairs]), torch.stack([pair[1] for pair in pairs])
        _, infos = assert_each_client_alone(p, M)
        assert not any(info.failed for info in infos)


def test_zero_inputs_and_empty_constraints():
    p, M = stack(80, d=30, rows=3)
    p[0] = 0.0
    M[3] = 0.0
    M[4, 2] = 0.0
    _, infos = assert_each_client_alone(p, M)
    assert infos[0].relative_change == 0.0 and math.isnan(infos[3].min_cosine) and infos[3].active == 0
    ptilde, stats = cone_project_batch(p, M[:, :0])
    assert torch.equal(ptilde, p) and ptilde is not p
    assert all(same_info(info, QPInfo(active=0, relative_change=0.0, min_cosine=math.nan, failed=False))
               for info in stats.infos())


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_inputs_fail_only_their_client(value):
    p, M = stack(90, d=40, rows=3)
    blocks = [(0, 20), (20, 40)]
    p[2, 5] = value
    M[4, 1, 25] = value
    ptilde, infos = assert_each_client_alone(p, M)
    assert [info.failed for info in infos] == [client in (2, 4) for client in range(CLIENTS)]
    assert torch.equal(ptilde[4], p[4])
    _, infos = assert_each_client_alone(p, M, blocks)
    assert [info.failed for info in infos] == [client in (2, 4) for client in range(CLIENTS)]


def test_an_overflowing_client_returns_its_p_and_the_others_are_projected():
    """The overflow of test_qp's test_output_overflow_returns_p in one row of the stack."""
    angle = math.pi / 8
    ray, normal = [math.cos(angle), math.sin(angle)], [-math.sin(angle), math.cos(angle)]
    M = torch.tensor([normal, [-x for x in normal], ray], dtype=torch.float32).expand(3, 3, 2).clone()
    p = torch.tensor([[3e38, 3e38], [3.0, 3.0], [-1.0, 2.0]], dtype=torch.float32)
    ptilde, infos = assert_each_client_alone(p, M)
    assert [info.failed for info in infos] == [True, False, False]
    assert torch.equal(ptilde[0], p[0]) and infos[1].active > 0
