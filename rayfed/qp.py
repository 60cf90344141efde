"""The cone projection of GradMA (Luo et al., CVPR 2023, arXiv:2302.14307, Eqs. 5-10): the QP

    ptilde = argmin_v 1/2 ||v - p||^2  s.t.  <v, M_j> >= margin * ||p|| * ||M_j||  for every row j,

solved through its C-dimensional dual min_{z >= 0} 1/2 z^T Q z + b^T z (Q = M M^T, b = M p, the
margin folded into b) and recovered as ptilde = p + z M. M is row-major: row j is the paper's
column M[:, j].

The worker calls this at every local step (C = 3) and the server once per round (C <= m), on
the whole model or on every parameter tensor (algorithm.qp_scope). Everything before and after the solve is
therefore batched over blocks of coordinates, and small QPs are solved together by exact
active-set enumeration in torch, on the tensors' device; larger ones go to cvxopt, as in the
authors' code.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import cvxopt
import numpy as np
import torch
from torch import Tensor

from rayfed.numerics import block_dot64, combine64, dense_condition, stacked_combine64, stacked_gram64

SOLVERS = ("auto", "cvxopt", "enum")
ENUM_MAX_ROWS = 3         # 2^C supports per QP: cheap for the worker's three constraints only
ENUM_TOL = 1e-12          # KKT slack accepted by the enumeration, relative to the normalised problem
ENUM_FALLBACK_TOL = 1e-6  # worst KKT violation still usable when rounding leaves no support within ENUM_TOL
ZERO_OUTPUT = 1e-6        # ||ptilde|| / ||p|| under which ptilde counts as 0 for min_cosine (the tests' tolerance)
CVXOPT_DUST = 1e-9        # interior-point multipliers below this (normalised) are inactive constraints
CVXOPT_OPTIONS = {"show_progress": False, "abstol": 1e-12, "reltol": 1e-12, "feastol": 1e-12, "maxiters": 200}


@dataclass
class QPInfo:
    """Diagnostics of one projection, for logging."""

    active: int              # constraints with z_j > 0; 0 on the fast path
    relative_change: float   # ||ptilde - p|| / ||p||; 0.0 when p == 0
    min_cosine: float        # min over kept rows of cos(ptilde, M_j); nan when no row is kept or ptilde ~ 0
    failed: bool             # the solver failed or something was non-finite, so p came back unchanged


@dataclass
class QPStats:
    """The diagnostics of B projections (cone_project_batch) as (B,) tensors on their device, so that
    a caller can add them up over local steps without waiting for the device: QPInfo's fields."""

    active: Tensor              # int64
    relative_change: Tensor     # float64
    min_cosine: Tensor          # float64
    failed: Tensor              # bool

    @classmethod
    def unchanged(cls, batch: int, device) -> "QPStats":
        """The diagnostics of projections that returned p as it was (no constraint rows)."""
        zeros = torch.zeros(batch, dtype=torch.float64, device=device)
        return cls(active=zeros.long(), relative_change=zeros, min_cosine=torch.full_like(zeros, math.nan),
                   failed=zeros.bool())

    def failing(self, which: Tensor) -> "QPStats":
        """These diagnostics with the projections `which` (B,) bool marked as failed ones that returned p."""
        return QPStats(active=torch.where(which, 0, self.active),
                       relative_change=torch.where(which, 0.0, self.relative_change),
                       min_cosine=torch.where(which, math.nan, self.min_cosine), failed=self.failed | which)

    def infos(self) -> list[QPInfo]:
        """One QPInfo per projection, with one host sync."""
        columns = torch.stack([self.active.double(), self.relative_change, self.min_cosine,
                               self.failed.double()], 1).tolist()
        return [QPInfo(active=int(active), relative_change=change, min_cosine=cosine, failed=bool(failed))
                for active, change, cosine, failed in columns]


def cone_project(p: Tensor, M: Tensor, *, gram: Tensor | None = None, margin: float = 0.0,
                 ridge: float = 1e-10, solver: str = "auto") -> tuple[Tensor, QPInfo]:
    """argmin_v 1/2||v - p||^2 s.t. <v, M_j> >= margin*||p||*||M_j|| for all rows j, via the dual
    (the dual of GradMA's Eq. 5). p is (d,), M is (C, d); ptilde comes back in p's dtype and device.
    `gram`: optional precomputed (C, C) float64 M M^T (the server keeps it incrementally); else
    computed with M p and ||p||^2 in one float64 product (cone_project_batch). Never raises for bad
    numbers: a failure returns p with info.failed set."""
    return cone_project_blocks(p, M, [(0, p.shape[0])], block_grams=None if gram is None else gram[None],
                               margin=margin, ridge=ridge, solver=solver)


def cone_project_blocks(p: Tensor, M: Tensor, blocks: Sequence[tuple[int, int]], *,
                        block_grams: Tensor | None = None, margin: float = 0.0, ridge: float = 1e-10,
                        solver: str = "auto") -> tuple[Tensor, QPInfo]:
    """qp_scope="tensor": one independent QP per [start, stop) block of coordinates
    (blocks partition range(d), in order); ptilde is their concatenation. block_grams: optional
    (T, C, C) float64. The info sums active constraints over blocks, takes the relative change of
    the whole vector and the smallest per-block cosine; failed if any block failed (that block
    keeps p; an overflow of the output returns p entirely)."""
    if block_grams is None:
        ptilde, stats = cone_project_batch(p[None], M[None], blocks, margin=margin, ridge=ridge, solver=solver)
        return ptilde[0], stats.infos()[0]
    _check_solver(solver, M.shape[0])
    _check_partition(blocks, p.shape[0])
    if M.shape[0] == 0:
        return p.clone(), QPInfo(active=0, relative_change=0.0, min_cosine=math.nan, failed=False)

    # The server's memory has up to m rows: only M p is computed here, the Gram is kept incrementally.
    gram = block_grams.to(p.device, torch.float64)
    p_dots = block_dot64(p[None], p[None], blocks)[:, 0, 0]
    b = block_dot64(M, p[None], blocks)[..., 0]
    z, corrected, stats = _solve_projections(gram[None], b[None], p_dots[None], margin, ridge, solver)
    z, corrected = z[0], corrected[0]

    ptilde = p.clone()
    corrected_flags = corrected.tolist()
    # Only active rows contribute: the server's memory has up to m rows but few active constraints.
    active_rows = (z > 0).any(0).nonzero()[:, 0] if any(corrected_flags) else None
    for index, ((start, stop), flag) in enumerate(zip(blocks, corrected_flags)):
        if flag:
            ptilde[start:stop] = combine64(p[start:stop], z[index, active_rows], M[active_rows, start:stop])
    # Blocks that failed on non-finite input keep their non-finite p; anything else non-finite is
    # an overflow of a corrected block's cast back to p's dtype.
    if any(corrected_flags) and bool((p.isfinite() & ~ptilde.isfinite()).any()):
        return p.clone(), QPInfo(active=0, relative_change=0.0, min_cosine=math.nan, failed=True)
    return ptilde, stats.infos()[0]


def cone_project_batch(p: Tensor, M: Tensor | Sequence[Tensor], blocks: Sequence[tuple[int, int]] | None = None, *,
                       margin: float = 0.0, ridge: float = 1e-10, solver: str = "auto") -> tuple[Tensor, QPStats]:
    """B independent projections at once (engine.vectorize's clients, or one worker step): p (B, d),
    M (B, C, d), or its C rows as (B, d) tensors (no stacked copy) -> ptilde (B, d) and their
    diagnostics as tensors, without a host sync. Per block of `blocks` (qp_scope="tensor") when given,
    else over all of d. Each projection gets the bits cone_project_blocks gives it alone, which calls
    this with B = 1 when no Gram is given: the (C+1) x (C+1) float64 Gram of [M; p] is one product per
    chunk of columns, giving Q, M p and ||p||^2 together, and the recovery p + z M runs on every
    block, kept only where corrected."""
    dim = p.shape[-1]
    blocks = [(0, dim)] if blocks is None else list(blocks)
    rows = list(M.unbind(1)) if isinstance(M, Tensor) else list(M)
    _check_solver(solver, len(rows))
    _check_partition(blocks, dim)
    if not rows:
        return p.clone(), QPStats.unchanged(p.shape[0], p.device)
    count = len(rows)
    grams = stacked_gram64([row[:, None] for row in rows] + [p[:, None]], blocks)
    z, corrected, stats = _solve_projections(grams[..., :count, :count], grams[..., :count, count],
                                             grams[..., count, count], margin, ridge, solver)
    ptilde, finite = stacked_combine64(p, z, rows, blocks, corrected)
    # Blocks that failed on non-finite input keep their non-finite p; a corrected block that is not
    # finite overflowed in the cast back to p's dtype, and that projection returns p.
    overflow = (corrected & ~finite).any(1)
    return torch.where(dense_condition(overflow[:, None], p), p, ptilde), stats.failing(overflow)


def _solve_projections(gram: Tensor, b: Tensor, p_dots: Tensor, margin: float, ridge: float,
                       solver: str) -> tuple[Tensor, Tensor, QPStats]:
    """The duals of B projections of T blocks each, from float64 gram (B, T, C, C), b = M p (B, T, C)
    and ||p||^2 (B, T). Returns z (B, T, C), zero where a block is not corrected, the corrected
    blocks (B, T), and the diagnostics of each projection."""
    # A non-finite p or M always shows in these products (nan * 0 is nan), so one check covers the input.
    finite = gram.isfinite().all(-1).all(-1) & b.isfinite().all(-1) & p_dots.isfinite()
    gram = torch.where(finite[..., None, None], gram, 0.0)
    b = torch.where(finite[..., None], b, 0.0)
    p_dots = torch.where(finite, p_dots, 0.0)

    row_norms2 = gram.diagonal(dim1=-2, dim2=-1)
    keep = _kept_rows(row_norms2)
    # Square roots before the product: ||p||^2 ||M_j||^2 can leave the float64 range where each factor does not.
    b_margin = b - margin * p_dots.sqrt()[..., None] * row_norms2.sqrt()
    violated = (keep & (b_margin < 0)).any(-1)

    z = _solve_batch(gram.flatten(0, 1), b_margin.flatten(0, 1), keep.flatten(0, 1), ridge, solver).view_as(b)
    solved = z.isfinite().all(-1)
    corrected = violated & solved
    failed = ~finite | (violated & ~solved)
    z = torch.where(corrected[..., None], z, 0.0)

    # Diagnostics from the float64 algebra, with no further pass over M: <ptilde, M_j> = b_j + (Q z)_j
    # and ||ptilde||^2 = ||p||^2 + 2 b.z + z^T Q z.
    # Products and sums over the last dimension, not einsum: its batched product sums in an order that
    # depends on the batch size, and a client's diagnostics must not depend on the clients beside it.
    gram_z = (gram * z[..., None, :]).sum(-1)
    inner = b + gram_z
    change2 = (z * gram_z).sum(-1).clamp(min=0.0)
    out_norms2 = (p_dots + 2 * (b * z).sum(-1) + change2).clamp(min=0.0)
    total_p2 = p_dots.sum(-1)
    whole_change = torch.where(total_p2 > 0, (change2.sum(-1) / total_p2).sqrt(), 0.0)
    # A ptilde that is zero up to rounding (p in the polar cone, or a tiny block squeezed between
    # opposite rows) has no meaningful direction: its cosines would be rounding noise of either sign.
    valid = keep & ~failed[..., None] & (out_norms2 > ZERO_OUTPUT ** 2 * p_dots)[..., None]
    cosines = inner / out_norms2.sqrt()[..., None] / row_norms2.sqrt()
    lowest_cosine = torch.where(valid, cosines, math.inf).amin((-2, -1))
    stats = QPStats(active=(z > 0).sum((-2, -1)), relative_change=whole_change,
                    min_cosine=torch.where(lowest_cosine < math.inf, lowest_cosine, math.nan),
                    failed=failed.any(-1))
    return z, corrected, stats


def solve_dual(gram: Tensor, b: Tensor, *, ridge: float = 1e-10, solver: str = "auto") -> tuple[Tensor, bool]:
    """z >= 0 minimising 1/2 z^T Q z + b^T z in float64, for Q = gram plus a ridge of `ridge` times
    each row's squared norm (a trace(Q)/C ridge after normalising rows to unit norm).
    Zero rows are dropped as in cone_project and get z_j = 0. Returns
    (z, failed); a failed z is all nan."""
    _check_solver(solver, gram.shape[0])
    gram = gram.to(torch.float64)[None]
    keep = _kept_rows(gram.diagonal(dim1=1, dim2=2))
    z = _solve_batch(gram, b.to(gram)[None], keep, ridge, solver)[0]
    return z, not bool(z.isfinite().all())


def _kept_rows(row_norms2: Tensor) -> Tensor:
    """(B, C) mask of the rows that are real constraints: zero rows (a3 at tau = 0,
    the memory of unsampled workers when beta_2 = 0) are trivially met and would make Q singular.
    No floor relative to the other rows: <v, M_j> >= 0 does not depend on ||M_j||, and a memory
    row decayed by beta_2^k is tiny yet still binding (the projection is invariant to rescaling a row).
    The squared norms are float64, so a nonzero float32 row has one of at least 2e-90; only float64
    rows shorter than about 1e-154 underflow to zero rows. cone_project fails a block with a
    non-finite row before this."""
    return row_norms2 > 0


def _solve_batch(gram: Tensor, b: Tensor, keep: Tensor, ridge: float, solver: str) -> Tensor:
    """z (B, C) for B independent duals; z_j = 0 on dropped rows, a row of nan where the solver failed."""
    rows = gram.shape[-1]
    eye = torch.eye(rows, dtype=gram.dtype, device=gram.device)
    # Solve for y with z = y * scale, on unit-norm rows and max |b| = 1. Row norms
    # differ by orders of magnitude (a3 is tiny early in a round, memory rows decay by beta_2 every
    # round), and a ridge relative to trace(Q)/C of the raw Gram would then swamp the short rows;
    # on unit rows trace/C = 1, so the relative ridge is ridge * I and perturbs every constraint
    # alike. The enumeration's tolerances and cvxopt's absolute ones also become scale-free.
    # Dropped rows become decoupled identity rows with b_j = 0, hence z_j = 0.
    norms = gram.diagonal(dim1=1, dim2=2).sqrt()
    norms = torch.where(keep, norms, 1.0)
    both_kept = keep[:, :, None] & keep[:, None, :]
    # One division at a time: n_i n_j of two rows with Q_ii ~ 1e-300 would underflow to 0.
    Q = torch.where(both_kept, gram / norms[:, :, None] / norms[:, None, :], eye) + ridge * eye
    b = torch.where(keep, b / norms, 0.0)
    b_scale = b.abs().amax(1)
    b_scale = torch.where(b_scale > 0, b_scale, 1.0)
    b = b / b_scale[:, None]
    if solver == "enum" or (solver == "auto" and rows <= ENUM_MAX_ROWS):
        y = _enumerate_supports(Q, b)
    else:
        y = _cvxopt_batch(Q, b, keep)
    return (y * (b_scale[:, None] / norms)).clamp(min=0.0)


@lru_cache(maxsize=None)
def _support_masks(rows: int, device: torch.device) -> Tensor:
    """(2^rows, rows) bool, every support ordered by size, then lexicographically; the empty one first
    so that an already feasible dual (b >= 0) is solved too. Kept per device: no copy per step."""
    supports = [subset for size in range(rows + 1) for subset in itertools.combinations(range(rows), size)]
    masks = torch.zeros(len(supports), rows, dtype=torch.bool)
    for index, subset in enumerate(supports):
        masks[index, list(subset)] = True
    return masks.to(device)


def _enumerate_supports(Q: Tensor, b: Tensor) -> Tensor:
    """Exact active-set enumeration for a batch of small duals, Q (B, C, C) positive definite on its
    kept rows, b (B, C), float64. For every support A it solves Q_AA z_A = -b_A and takes the first
    support, in _support_masks order, whose z_A >= 0 and (Q z + b)_j >= 0 off A (and = 0 on A),
    up to ENUM_TOL.
    All supports of all problems go to the linear solver in one call, so it runs on any device
    without a Python loop or host sync. Rows of nan where no support is usable."""
    batch, rows = b.shape
    masks = _support_masks(rows, Q.device)
    inside = masks[:, :, None] & masks[:, None, :]
    # Identity outside A makes the system block diagonal, so one full-size solve gives z_A and z = 0 off A.
    eye = torch.eye(rows, dtype=Q.dtype, device=Q.device)
    systems = torch.where(inside, Q[:, None], eye)
    rhs = torch.where(masks, -b[:, None], 0.0)
    z, info = torch.linalg.solve_ex(systems, rhs)
    gradient = (Q[:, None] * z[:, :, None, :]).sum(-1) + b[:, None]
    # The residual on A is checked too: a nearly singular Q_AA (dependent rows, no ridge) can give
    # a huge z_A that solves the system only loosely, and must not pass for a KKT point.
    stationarity = torch.where(masks, gradient.abs(), -gradient).clamp(min=0.0).amax(2)
    violation = torch.maximum((-z).clamp(min=0.0).amax(2), stationarity)
    violation = torch.where(info == 0, violation, math.inf).nan_to_num(nan=math.inf)
    scale = b.abs().amax(1) + Q.diagonal(dim1=1, dim2=2).sum(1)
    acceptable = violation <= ENUM_TOL * scale[:, None]
    # Rounding on a nearly singular Q_AA can push every support just past tol; then the least
    # violating one is still the solution to working precision.
    choice = torch.where(acceptable.any(1), acceptable.int().argmax(1), violation.argmin(1))
    picked = torch.arange(batch, device=Q.device)
    usable = violation[picked, choice] <= ENUM_FALLBACK_TOL * scale
    return torch.where(usable[:, None], z[picked, choice], math.nan)


def _cvxopt_batch(Q: Tensor, b: Tensor, keep: Tensor) -> Tensor:
    """The authors' solver (cvxopt.solvers.qp on the dual), one QP at a time on the kept rows."""
    Q_host, b_host, keep_host = Q.cpu().numpy(), b.cpu().numpy(), keep.cpu().numpy()
    y = np.zeros_like(b_host)
    for index in range(len(b_host)):
        rows = np.flatnonzero(keep_host[index])
        if (b_host[index, rows] >= 0).all():
            continue
        y[index, rows] = _cvxopt_solve(Q_host[index][np.ix_(rows, rows)], b_host[index, rows])
    return torch.from_numpy(y).to(Q.device)


def _cvxopt_solve(Q: np.ndarray, b: np.ndarray) -> np.ndarray:
    rows = len(b)
    try:
        solution = cvxopt.solvers.qp(cvxopt.matrix(Q), cvxopt.matrix(b), cvxopt.matrix(-np.eye(rows)),
                                     cvxopt.matrix(np.zeros(rows)), options=CVXOPT_OPTIONS)
    except Exception:  # noqa: BLE001 - any solver error falls back to p, as in the authors' code
        return np.full(rows, np.nan)
    y = np.array(solution["x"]).ravel()
    # Interior-point multipliers of inactive constraints stay about the duality gap above 0.
    return np.where(y <= CVXOPT_DUST, 0.0, y)


def _check_solver(solver: str, rows: int) -> None:
    if solver not in SOLVERS:
        raise ValueError(f"unknown QP solver {solver!r}; expected one of {SOLVERS}")
    if solver == "enum" and rows > ENUM_MAX_ROWS:
        raise ValueError(f"QP solver 'enum' handles at most {ENUM_MAX_ROWS} constraints, got {rows}")


def _check_partition(blocks: Sequence[tuple[int, int]], dim: int) -> None:
    expected = 0
    for start, stop in blocks:
        if start != expected or stop < start:
            raise ValueError(f"QP blocks must partition range({dim}) in order; got {list(blocks)}")
        expected = stop
    if not blocks or expected != dim:
        raise ValueError(f"QP blocks must partition range({dim}) in order; got {list(blocks)}")
