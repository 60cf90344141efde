"""The cone-projection QP against specs/gradma.md §2 and the QP checks 1-9 of §7.

References are independent of rayfed.qp: a Lawson-Hanson NNLS on min_{z>=0} ||M^T z + p|| and a
brute-force enumeration of supports by least squares, both in numpy float64.
"""
import itertools
import math

import cvxopt
import numpy as np
import pytest
import torch

from rayfed.algorithms.memory import GradientMemory
from rayfed.numerics import block_dot64, dot64
from rayfed.qp import cone_project, cone_project_blocks, solve_dual

SEEDS = range(16)


def nnls(A, y):
    """Lawson-Hanson: argmin_{x >= 0} ||A x - y||."""
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.abs(A).sum(0).max() * max(A.shape) * max(1.0, np.abs(y).max())
    gradient = A.T @ y
    for _ in range(3 * n + 10):
        if passive.all() or gradient[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while True:
            trial = np.zeros(n)
            trial[passive] = np.linalg.lstsq(A[:, passive], y, rcond=None)[0]
            if trial[passive].min() > 0:
                break
            shrinking = passive & (trial <= 0)
            step = np.min(x[shrinking] / (x[shrinking] - trial[shrinking]))
            x = x + step * (trial - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = trial
        gradient = A.T @ (y - A @ x)
    return x


def reference_nnls(p, M):
    """ptilde = p + M^T z, z = NNLS(M^T, -p), on the QR-reduced problem so that big d stays cheap."""
    p, M = p.double().numpy(), M.double().numpy()
    basis, triangle = np.linalg.qr(M.T)
    z = nnls(triangle, -(basis.T @ p))
    return p + M.T @ z


def reference_enumeration(p, M):
    """The first support A whose least-squares multipliers satisfy every KKT condition."""
    p, M = p.double().numpy(), M.double().numpy()
    tol = 1e-10 * np.linalg.norm(p) * max(1.0, np.linalg.norm(M, axis=1).max())
    for size in range(M.shape[0] + 1):
        for support in itertools.combinations(range(M.shape[0]), size):
            rows = M[list(support)]
            z = np.linalg.lstsq(rows.T, -p, rcond=None)[0] if size else np.zeros(0)
            ptilde = p + rows.T @ z
            if (z >= -tol).all() and (M @ ptilde >= -tol).all():
                return ptilde
    raise AssertionError("no support satisfies the KKT conditions")


def instance(seed, d=None, rows=None, dtype=torch.float64):
    """Random p and M with rows of very different norms; p is pushed against some rows so that
    both active and inactive constraints occur."""
    rng = np.random.default_rng(seed)
    d = d or int(rng.integers(2, 201))
    rows = rows or int(rng.integers(1, 13))
    M = rng.standard_normal((rows, d)) * 10.0 ** rng.uniform(-2, 2, size=(rows, 1))
    p = rng.standard_normal(d) * 10.0 ** rng.uniform(-3, 3)
    pushed = rng.random(rows) < 0.5
    p -= np.linalg.norm(p) * (pushed[:, None] * M / np.linalg.norm(M, axis=1, keepdims=True)).sum(0)
    return torch.tensor(p, dtype=dtype), torch.tensor(M, dtype=dtype)


def dual_of(p, M, **kwargs):
    z, failed = solve_dual(dot64(M, M), dot64(M, p[None])[:, 0], **kwargs)
    assert not failed
    return z


def assert_kkt(p, M, ptilde, z=None):
    """§7 check 4 with tol_j = 1e-6 ||p|| ||M_j||; z, when given, must reproduce ptilde."""
    p64, M64, out = p.double(), M.double(), ptilde.double()
    p_norm, row_norms = p64.norm(), M64.norm(dim=1)
    tol = 1e-6 * p_norm * row_norms
    inner = M64 @ out
    assert torch.isfinite(out).all()
    assert (inner >= -tol).all(), (inner / (p_norm * row_norms)).min()
    if z is not None:
        assert (z >= -1e-12).all()
        # Dependent rows can carry large cancelling multipliers: rounding scales with sum z_j ||M_j||.
        assert torch.allclose(out, p64 + z @ M64, rtol=0, atol=1e-12 * float(p_norm + z.abs() @ row_norms))
        # Complementary slackness |z_j <ptilde, M_j>| <= z_j tol_j: every used constraint is tight.
        assert ((z * inner).abs() <= z * tol).all()


def assert_close(actual, expected, rel=1e-8, p=None):
    """||actual - expected|| <= rel * ||p|| (the projection's natural scale: ptilde itself may be ~0),
    or rel * ||expected|| without p."""
    actual, expected = torch.as_tensor(actual).double(), torch.as_tensor(expected).double()
    scale = max(float((expected if p is None else p).double().norm()), 1e-300)
    assert float((actual - expected).norm()) <= rel * scale, float((actual - expected).norm()) / scale


# ---- check 1, 2, 3: empty memory, feasible input, one constraint ----

def test_empty_memory_returns_p():
    p = torch.randn(7)
    ptilde, info = cone_project(p, torch.zeros(0, 7))
    assert torch.equal(ptilde, p)
    assert info.active == 0 and info.relative_change == 0.0 and math.isnan(info.min_cosine) and not info.failed


@pytest.mark.parametrize("seed", SEEDS)
def test_feasible_input_is_returned_exactly(seed):
    p, M = instance(seed, dtype=torch.float32)
    M = M * torch.where(M @ p >= 0, 1.0, -1.0)[:, None]
    ptilde, info = cone_project(p, M)
    assert torch.equal(ptilde, p) and ptilde is not p
    assert info.active == 0 and info.relative_change == 0.0 and not info.failed
    assert info.min_cosine >= 0
    assert torch.equal(dual_of(p, M), torch.zeros(M.shape[0], dtype=torch.float64))


def test_fast_path_never_calls_the_solver(monkeypatch):
    monkeypatch.setattr(cvxopt.solvers, "qp", None)
    p, M = instance(2, rows=6)
    M = M * torch.where(M @ p >= 0, 1.0, -1.0)[:, None]
    ptilde, info = cone_project(p, M)
    assert torch.equal(ptilde, p) and not info.failed


def test_single_feasible_row_is_a_fast_path():
    p, a = torch.randn(30), torch.randn(30)
    ptilde, info = cone_project(p, torch.sign(p @ a) * a[None])
    assert torch.equal(ptilde, p) and info.active == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_single_constraint_closed_form(seed):
    p, M = instance(seed, rows=1)
    a = M[0]
    expected = p - min(0.0, float(p @ a)) / float(a @ a) * a
    ptilde, info = cone_project(p, M)
    assert_close(ptilde, expected, 1e-9, p)     # the 1e-10 ridge
    assert info.active == (1 if p @ a < 0 else 0)


# ---- check 4, 5: KKT and projection optimality ----

@pytest.mark.parametrize("seed", SEEDS)
def test_kkt_and_nnls_reference(seed):
    p, M = instance(seed)
    ptilde, info = cone_project(p, M)
    z = dual_of(p, M)
    assert_kkt(p, M, ptilde, z)
    assert_close(ptilde, reference_nnls(p, M), p=p)
    assert info.active == int((z > 0).sum()) and not info.failed
    assert math.isclose(info.relative_change, float((ptilde - p).norm() / p.norm()), rel_tol=1e-9, abs_tol=1e-15)
    cosines = (M @ ptilde) / (ptilde.norm() * M.norm(dim=1))
    assert math.isclose(info.min_cosine, float(cosines.min()), rel_tol=1e-6, abs_tol=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_brute_force_enumeration_reference(seed):
    p, M = instance(100 + seed, rows=1 + seed % 8)
    assert_close(cone_project(p, M)[0], reference_enumeration(p, M), p=p)


@pytest.mark.parametrize("seed", SEEDS)
def test_enumeration_and_cvxopt_agree_for_the_worker_qp(seed):
    p, M = instance(200 + seed, rows=1 + seed % 3)
    by_enum, _ = cone_project(p, M, solver="enum")
    by_cvxopt, _ = cone_project(p, M, solver="cvxopt")
    assert torch.equal(cone_project(p, M)[0], by_enum)          # auto picks enumeration for C <= 3
    assert_close(by_enum, by_cvxopt, p=p)


# ---- check 6: geometry ----

@pytest.mark.parametrize("seed", SEEDS)
def test_projection_geometry(seed):
    p, M = instance(300 + seed)
    ptilde, _ = cone_project(p, M)
    assert abs(float((p - ptilde) @ ptilde)) <= 1e-8 * float(p @ p)
    assert float(ptilde.norm()) <= float(p.norm()) * (1 + 1e-12)
    # ptilde is feasible only up to rounding, and a violation eps can move the projection by
    # eps / sigma_min of the active rows (Hoffman's bound); these instances have C up to d.
    again, _ = cone_project(ptilde, M)
    assert_close(again, ptilde, 1e-6, p)


# ---- check 7: invariances ----

@pytest.mark.parametrize("seed", range(12))
def test_invariances(seed):
    p, M = instance(400 + seed)
    ptilde, _ = cone_project(p, M)
    rng = np.random.default_rng(seed)
    for factor in (1e-3, 7.5, 1e4):
        assert_close(cone_project(factor * p, M)[0], factor * ptilde)
    row_scales = torch.tensor(10.0 ** rng.uniform(-3, 3, size=(M.shape[0], 1)))
    assert_close(cone_project(p, row_scales * M)[0], ptilde)
    assert_close(cone_project(p, M[torch.tensor(rng.permutation(M.shape[0]))])[0], ptilde)
    duplicated = torch.cat([M, 3.0 * M[torch.tensor(rng.integers(0, M.shape[0], size=4))]])
    assert_close(cone_project(p, duplicated)[0], ptilde)
    assert_close(cone_project(p, torch.cat([M, torch.zeros(3, M.shape[1])]))[0], ptilde)
    zero, info = cone_project(torch.zeros_like(p), M)
    assert torch.equal(zero, torch.zeros_like(p)) and info.relative_change == 0.0


# ---- §2.1 invariance to rescaling rows, whatever their size (§2.5 step 3) ----

RESCALINGS = [1e-30, 1e-20, 1e-12, 1e-6, 1e6, 1e12, 1e20, 1e30]
# Rescaling is exact up to the rounding of c M and of the output, which the projection's
# conditioning amplifies. Measured worst cases, relative to ||p||: 6e-16 in float64 (1e-15 on 20
# other seeds) and 4e-8 in float32, below half an ulp of a float32 output (6e-8); the stale-memory
# test below, whose reference is float64, reaches 3e-15 and 2.5e-7 (on 10 seeds).
RESCALING_TOLERANCE = {torch.float64: 1e-13, torch.float32: 1e-6}


def project_by(path, p, M, blocks):
    """The same projection through the worker's path (Gram computed inside), the server's (Gram
    given), or per block with block Grams given (qp_scope="tensor")."""
    if path == "direct":
        return cone_project(p, M)
    if path == "gram":
        return cone_project(p, M, gram=dot64(M, M))
    return cone_project_blocks(p, M, blocks, block_grams=block_dot64(M, M, blocks))


@pytest.mark.parametrize("path", ["direct", "gram", "blocks"])
@pytest.mark.parametrize("rows", [3, 8], ids=["enum", "cvxopt"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_invariant_to_rescaling_rows_by_any_factor(dtype, rows, path):
    """QP(p, c M) = QP(p, M) for c from 1e-30 to 1e30, and with every row rescaled by its own factor
    in that range. The rows' norms lie in [1e-2, 1e2], so c M stays within float32's normal range."""
    blocks = [(0, 25), (25, 26), (26, 60)]
    rng = np.random.default_rng(rows)
    for seed in range(4):
        p, M = instance(1000 + seed, d=60, rows=rows, dtype=dtype)
        expected, info = project_by(path, p, M, blocks)
        assert info.active > 0 and not info.failed
        row_factors = torch.tensor(10.0 ** rng.uniform(-30, 30, size=(rows, 1)), dtype=dtype)
        for scaled in [c * M for c in RESCALINGS] + [row_factors * M]:
            ptilde, scaled_info = project_by(path, p, scaled, blocks)
            assert scaled_info.active == info.active and not scaled_info.failed
            assert_close(ptilde, expected, RESCALING_TOLERANCE[dtype], p)


def stale_memory(ages, dim, dtype, blocks=None, beta2=0.1, seed=0):
    """A GradMA memory whose client k was last sampled ages[k] rounds ago: its row is its last
    upload decayed by beta2^ages[k] (1e-30 at age 30 for beta2 = 0.1)."""
    generator = torch.Generator().manual_seed(seed)
    memory = GradientMemory(capacity=len(ages), dim=dim, beta2=beta2, blocks=blocks, dtype=dtype)
    rounds = max(ages) + 1
    for t in range(rounds):
        sampled = [client for client, age in enumerate(ages) if t < rounds - age]
        memory.admit(sampled)
        memory.update({client: torch.randn(dim, generator=generator, dtype=dtype) for client in sampled})
    return memory


@pytest.mark.parametrize("scope", ["model", "tensor"])
@pytest.mark.parametrize("ages", [[0, 10, 30], [0, 0, 10, 15, 20, 25, 30, 30]], ids=["enum", "cvxopt"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_stale_memory_rows_stay_binding(dtype, ages, scope):
    """The server QP against D with its incremental Gram: rows decayed by beta2 = 0.1 over 10 to 30
    rounds (norms down to 1e-30) that p opposes must still be met, and the projection must equal
    the one against the same rows un-decayed."""
    blocks = [(0, 12), (12, 40)]
    memory = stale_memory(ages, 40, dtype, blocks if scope == "tensor" else None)
    assert memory.buffered == list(range(len(ages)))
    D = memory.rows
    stale = torch.tensor(ages) > 0
    undecayed = D.double() * (10.0 ** torch.tensor(ages, dtype=torch.float64))[:, None]
    unit = undecayed / undecayed.norm(dim=1, keepdim=True)
    p = (0.5 * torch.randn(40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
         - 2 * unit[stale].sum(0)).to(dtype)
    # Every stale row is opposed by p, so the old relative floor, which dropped rows under 1e-10
    # of the largest, let the result keep opposing them.
    assert (unit[stale] @ p.double() < -0.1 * float(p.double().norm())).all()
    if scope == "model":
        ptilde, info = cone_project(p, D, gram=memory.gram)
        expected, expected_info = cone_project(p.double(), undecayed)
        inner, row_norms = D.double() @ ptilde.double(), D.double().norm(dim=1)
    else:
        ptilde, info = cone_project_blocks(p, D, blocks, block_grams=memory.gram)
        expected, expected_info = cone_project_blocks(p.double(), undecayed, blocks)
        inner = torch.stack([D[:, start:stop].double() @ ptilde[start:stop].double() for start, stop in blocks])
        row_norms = torch.stack([D[:, start:stop].double().norm(dim=1) for start, stop in blocks])
    assert not info.failed and info.active == expected_info.active > 0
    assert (inner >= -1e-6 * float(p.double().norm()) * row_norms).all()
    assert_close(ptilde, expected, RESCALING_TOLERANCE[dtype], p)


@pytest.mark.parametrize("blocks", [None, [(0, 7), (7, 8), (8, 40)]], ids=["model", "tensor"])
def test_memory_rows_decaying_to_zero_leave_no_phantom_constraint(blocks):
    """Unsampled at beta2 = 0.1, a float32 row turns subnormal after about 38 rounds and zero after
    about 46; at every stage the server QP with D's incremental Gram must give the projection
    against the rows D actually holds, feasible for every row."""
    generator = torch.Generator().manual_seed(3)
    memory = GradientMemory(capacity=3, dim=40, beta2=0.1, blocks=blocks)
    memory.admit([0, 1, 2])
    uploads = {client: torch.randn(40, generator=generator) for client in range(3)}
    memory.update(uploads)
    p = torch.randn(40, generator=generator) - 2 * uploads[2] / uploads[2].norm()
    whole = [(0, 40)]
    for _ in range(55):
        memory.admit([0, 1])
        memory.update({client: torch.randn(40, generator=generator) for client in (0, 1)})
        D = memory.rows
        if blocks is None:
            ptilde, info = cone_project(p, D, gram=memory.gram)
            expected, _ = cone_project(p, D)
        else:
            ptilde, info = cone_project_blocks(p, D, blocks, block_grams=memory.gram)
            expected, _ = cone_project_blocks(p, D, blocks)
        assert not info.failed
        assert_close(ptilde, expected, 1e-6, p)
        for start, stop in blocks or whole:
            inner = D[:, start:stop].double() @ ptilde[start:stop].double()
            assert (inner >= -1e-6 * float(p.double().norm()) * D[:, start:stop].double().norm(dim=1)).all()
    assert not D[memory.slot_of(2)].any()


# ---- check 8: degenerate Gram matrices and failures ----

def degenerate_instances():
    rng = np.random.default_rng(7)
    p = rng.standard_normal(40)
    basis = rng.standard_normal((3, 40))
    dependent = rng.standard_normal((9, 3)) @ basis
    more_rows_than_d = rng.standard_normal((12, 5))
    nearly_parallel = basis[0] + 1e-5 * rng.standard_normal((4, 40))
    duplicated = np.repeat(basis, 3, axis=0)
    with_zero_rows = np.concatenate([basis, np.zeros((2, 40)), 1e-13 * basis[:1]])
    return {
        "dependent": (p - dependent.sum(0), dependent),
        "C > d": (rng.standard_normal(5), more_rows_than_d),
        "nearly parallel": (p - 2 * basis[0], nearly_parallel),
        "duplicated": (p - basis.sum(0), duplicated),
        "zero rows": (p - basis.sum(0), with_zero_rows),
        "all zero": (p, np.zeros((4, 40))),
        "antiparallel pair": (p, np.stack([basis[0], -basis[0]])),
        "p in the polar cone": (-basis.sum(0), basis),
    }


@pytest.mark.parametrize("name", list(degenerate_instances()))
@pytest.mark.parametrize("solver", ["auto", "cvxopt"])
def test_degenerate_grams_give_finite_kkt_points(name, solver):
    p, M = (torch.tensor(value) for value in degenerate_instances()[name])
    ptilde, info = cone_project(p, M, solver=solver)
    assert not info.failed
    assert_kkt(p, M, ptilde, dual_of(p, M, solver=solver))
    assert_close(ptilde, reference_nnls(p, M), 1e-6 if name == "nearly parallel" else 1e-8, p)
    if name == "all zero":
        assert torch.equal(ptilde, p)
    if name in ("all zero", "p in the polar cone"):
        assert math.isnan(info.min_cosine)
    if name == "p in the polar cone":
        assert float(ptilde.norm()) <= 1e-8 * float(p.norm())


def test_large_memory_and_dimension():
    """The server's scale: C = 100 rows of d = 1e5, rank 60 and with duplicated and zero rows."""
    rng = np.random.default_rng(11)
    d = 100_000
    M = rng.standard_normal((60, d)).astype(np.float32)
    M = np.concatenate([M, (rng.random((30, 60)) @ M[:60]).astype(np.float32), M[:5], np.zeros((5, d), np.float32)])
    p = torch.tensor(rng.standard_normal(d) - 0.05 * M[:40].sum(0), dtype=torch.float32)
    M = torch.tensor(M)
    ptilde, info = cone_project(p, M)
    assert ptilde.dtype == torch.float32 and not info.failed and info.active > 0
    assert_kkt(p, M, ptilde)
    assert_close(ptilde, reference_nnls(p, M), 1e-6, p)              # float32 output
    assert abs(float((p.double() - ptilde.double()) @ ptilde.double())) <= 1e-6 * float(p.double() @ p.double())


def test_solver_exception_returns_p(monkeypatch):
    def broken_qp(*args, **kwargs):
        raise ArithmeticError("singular KKT matrix")

    monkeypatch.setattr(cvxopt.solvers, "qp", broken_qp)
    p, M = instance(3, rows=6)
    ptilde, info = cone_project(p, M)
    assert torch.equal(ptilde, p) and info.failed and info.active == 0
    assert solve_dual(dot64(M, M), dot64(M, p[None])[:, 0])[1]


@pytest.mark.parametrize("where", ["p", "M"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("rows", [2, 6])
def test_non_finite_input_returns_p(where, value, rows):
    p, M = instance(5, d=20, rows=rows, dtype=torch.float32)
    (p if where == "p" else M[-1])[3] = value
    ptilde, info = cone_project(p, M)
    assert info.failed and info.active == 0
    assert torch.equal(ptilde.view(torch.int32), p.view(torch.int32))


def test_non_finite_row_or_gram_on_the_server_path_returns_p():
    """§2.5 step 9 with a precomputed Gram: a non-finite row shows in M p even when the Gram was
    finite, and a non-finite Gram entry fails as well; neither poisons the result."""
    p, M = instance(6, d=30, rows=6, dtype=torch.float32)
    gram = dot64(M, M)
    broken_row = M.clone()
    broken_row[2, 4] = math.nan
    broken_gram = gram.clone()
    broken_gram[1, 3] = broken_gram[3, 1] = math.inf
    for rows, given in ((broken_row, gram), (M, broken_gram)):
        ptilde, info = cone_project(p, rows, gram=given)
        assert info.failed and info.active == 0
        assert torch.equal(ptilde, p)


def test_output_overflow_returns_p():
    """Projecting p = (3e38, 3e38) onto the ray at 22.5 degrees gives a first coordinate of
    ||p|| cos^2(22.5 deg) = 3.6e38, past the float32 range."""
    angle = math.pi / 8
    ray, normal = [math.cos(angle), math.sin(angle)], [-math.sin(angle), math.cos(angle)]
    M = torch.tensor([normal, [-x for x in normal], ray], dtype=torch.float32)
    p = torch.tensor([3e38, 3e38], dtype=torch.float32)
    ptilde, info = cone_project(p, M)
    assert torch.equal(ptilde, p) and info.failed
    finite, info = cone_project(p.double(), M.double())
    assert not info.failed and float(finite[0]) > 3.5e38


def test_unknown_or_unfit_solver_is_a_programming_error():
    p, M = instance(0, rows=4)
    with pytest.raises(ValueError, match="nnls"):
        cone_project(p, M, solver="nnls")
    with pytest.raises(ValueError, match="enum"):
        cone_project(p, M, solver="enum")
    with pytest.raises(ValueError, match="enum"):
        solve_dual(torch.eye(4, dtype=torch.float64), -torch.ones(4, dtype=torch.float64), solver="enum")


# ---- margin, dtypes, diagnostics ----

@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("rows", [3, 8])
def test_margin_is_met(seed, rows):
    p, M = instance(500 + seed, rows=rows)
    M = M * torch.where(M @ p >= 0, 1.0, -1.0)[:, None]            # feasible at margin 0
    rho = 0.2
    ptilde, info = cone_project(p, M, margin=rho)
    tol = 1e-6 * p.norm() * M.norm(dim=1)
    assert (M @ ptilde >= rho * p.norm() * M.norm(dim=1) - tol).all()
    assert not info.failed and info.min_cosine >= rho * float(p.norm() / ptilde.norm()) - 1e-6
    assert torch.equal(cone_project(p, M, margin=0.0)[0], p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [3, 7])
def test_output_keeps_the_input_dtype(dtype, rows):
    p, M = instance(9, d=150, rows=rows, dtype=dtype)
    ptilde, info = cone_project(p, M)
    assert ptilde.dtype == dtype and ptilde.device == p.device and info.active > 0
    assert_kkt(p, M, ptilde)
    assert_close(ptilde, reference_nnls(p, M), 1e-6 if dtype == torch.float32 else 1e-8, p)


def assert_same_info(actual, expected, rel=1e-12):
    assert (actual.active, actual.failed) == (expected.active, expected.failed)
    assert math.isclose(actual.relative_change, expected.relative_change, rel_tol=rel)
    assert math.isclose(actual.min_cosine, expected.min_cosine, rel_tol=rel, abs_tol=rel)


def test_precomputed_gram_gives_the_same_projection():
    """Up to the summation order of the float64 products: without a Gram, Q, M p and ||p||^2 are one
    product of [M; p] with itself; with one, M p and ||p||^2 are products of their own."""
    p, M = instance(12, rows=5, dtype=torch.float32)
    ptilde, info = cone_project(p, M)
    again, info_again = cone_project(p, M, gram=dot64(M, M))
    assert_close(again, ptilde, 1e-7, p)
    assert_same_info(info_again, info)


def random_blocks(rng, start, stop, count):
    """`count` contiguous non-empty blocks partitioning [start, stop)."""
    cuts = np.sort(rng.choice(np.arange(start + 1, stop), size=count - 1, replace=False))
    edges = [start, *cuts.tolist(), stop]
    return list(zip(edges[:-1], edges[1:]))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("rows", [3, 6])
def test_tensor_scope_satisfies_kkt_per_block(seed, rows):
    rng = np.random.default_rng(seed)
    p, M = instance(600 + seed, d=int(rng.integers(20, 200)), rows=rows)
    # Bias-like blocks with fewer coordinates than constraints make rank-deficient block Grams.
    blocks = [(0, 1), (1, 3)] + random_blocks(rng, 3, p.shape[0], int(rng.integers(1, 8)))
    ptilde, info = cone_project_blocks(p, M, blocks)
    assert not info.failed
    # Without the ridge the projection is exact even on the rank-deficient blocks; the ridge's
    # error grows with the multipliers, which nearly opposite rows in a tiny block make large.
    exact, _ = cone_project_blocks(p, M, blocks, ridge=0.0)
    active, squared_change = 0, 0.0
    for start, stop in blocks:
        part_p, part_M = p[start:stop], M[:, start:stop]
        z = dual_of(part_p, part_M)
        assert_kkt(part_p, part_M, ptilde[start:stop], z)
        assert_close(exact[start:stop], reference_nnls(part_p, part_M), p=part_p)
        if stop - start > rows:
            assert_close(ptilde[start:stop], reference_nnls(part_p, part_M), p=part_p)
        active += int((z > 0).sum())
        squared_change += float((ptilde[start:stop] - part_p).norm() ** 2)
    assert info.active == active
    assert math.isclose(info.relative_change, math.sqrt(squared_change) / float(p.norm()), rel_tol=1e-8)


@pytest.mark.parametrize("rows", [2, 3, 5])
def test_single_block_equals_model_scope(rows):
    p, M = instance(700 + rows, rows=rows, dtype=torch.float32)
    whole = [(0, p.shape[0])]
    ptilde, info = cone_project(p, M)
    blocked, blocked_info = cone_project_blocks(p, M, whole)
    assert torch.equal(blocked, ptilde) and blocked_info == info
    ptilde, info = cone_project(p, M, gram=dot64(M, M))
    blocked, blocked_info = cone_project_blocks(p, M, whole, block_grams=dot64(M, M)[None])
    assert torch.equal(blocked, ptilde) and blocked_info == info


@pytest.mark.parametrize("seed", range(8))
def test_batched_enumeration_equals_per_block_cvxopt(seed):
    rng = np.random.default_rng(seed)
    p, M = instance(800 + seed, d=180, rows=3, dtype=torch.float32)
    M[2, :60] = 0.0                                                  # a3-like zero row in some blocks
    blocks = random_blocks(rng, 0, 180, 12)
    by_enum, info = cone_project_blocks(p, M, blocks, solver="enum")
    by_cvxopt = torch.cat([cone_project(p[start:stop], M[:, start:stop], solver="cvxopt")[0] for start, stop in blocks])
    by_cvxopt_blocks, cvxopt_info = cone_project_blocks(p, M, blocks, solver="cvxopt")
    assert torch.equal(by_cvxopt_blocks, by_cvxopt)
    assert torch.allclose(by_enum, by_cvxopt, rtol=1e-6, atol=1e-6 * float(p.abs().max()))
    assert not info.failed and math.isclose(info.relative_change, cvxopt_info.relative_change, rel_tol=1e-6)


def test_tensor_scope_isolates_a_failed_block():
    p, M = instance(900, d=60, rows=3, dtype=torch.float32)
    blocks = [(0, 20), (20, 40), (40, 60)]
    expected, _ = cone_project_blocks(p, M, blocks)
    M[1, 25] = math.nan
    ptilde, info = cone_project_blocks(p, M, blocks)
    assert info.failed
    assert torch.equal(ptilde[20:40], p[20:40])
    assert torch.equal(ptilde[:20], expected[:20]) and torch.equal(ptilde[40:], expected[40:])


def test_blocks_must_partition_the_vector():
    p, M = instance(1, d=10, rows=2)
    for blocks in ([(0, 5)], [(0, 5), (6, 10)], [(5, 10), (0, 5)], []):
        with pytest.raises(ValueError, match="partition"):
            cone_project_blocks(p, M, blocks)
