"""engine.vectorize for GradMA-W and GradMA: a stack of clients trains with its three gradient passes
per step and the QP_l of every step batched (cone_project_batch), each client from its own last local
model (ClientStates), and equals sequential training within the tolerance engine.vectorize documents;
the per-client QP diagnostics are averaged over the round as sequential ones."""
import pytest
import torch

from tests.test_engine_equivalence import run
from tests.test_vectorize import ATOL, RTOL, SMALL

# 8 rounds of 9 of 40 clients: many clients come back, so the last_local anchor comes from a state.
ROUNDS = 8
STEPS_PER_ROUND = 9 * 3      # clients x local steps: qp_local_active is a mean over them


@pytest.mark.parametrize("scope", ["model", "tensor"])
@pytest.mark.parametrize("anchor", ["last_local", "global"])
@pytest.mark.parametrize("algorithm", ["gradma_w", "gradma"])
def test_vectorized_gradma_matches_sequential_training(tmp_path, algorithm, anchor, scope):
    overrides = SMALL + [f"algorithm.name={algorithm}", f"algorithm.anchor_mode={anchor}",
                         f"algorithm.qp_scope={scope}", f"train.rounds={ROUNDS}"]
    sequential = run(tmp_path, overrides, "sequential")
    vectorized = run(tmp_path, overrides + ["engine.vectorize=true"], "vectorized")
    assert vectorized.summary["vectorized"] and not sequential.summary["vectorized"]
    assert vectorized.summary["client_state_bytes"] == sequential.summary["client_state_bytes"]
    torch.testing.assert_close(vectorized.params, sequential.params, rtol=RTOL, atol=ATOL)
    for seq_round, vec_round in zip(sequential.history, vectorized.history):
        assert vec_round.keys() == seq_round.keys()
        assert vec_round["train_loss"] == pytest.approx(seq_round["train_loss"], rel=RTOL)
        # Averaged over the round's client-steps: a multiplier within rounding of 0 may count in one alone.
        assert vec_round["qp_local_active"] == pytest.approx(seq_round["qp_local_active"], abs=1 / STEPS_PER_ROUND)
        assert vec_round["qp_local_change"] == pytest.approx(seq_round["qp_local_change"], rel=1e-6)
        assert vec_round["qp_local_min_cosine"] == pytest.approx(seq_round["qp_local_min_cosine"], abs=1e-6)
        assert vec_round["qp_local_failures"] == seq_round["qp_local_failures"] == 0
        for key in ("qp_global_active", "qp_global_change", "memory_rows", "memory_evictions"):
            assert vec_round.get(key) == pytest.approx(seq_round.get(key), rel=1e-6)
    assert any(metrics["qp_local_active"] > 0 for metrics in sequential.history)


def test_vectorized_last_local_anchor_reads_each_clients_own_state(tmp_path):
    """The anchor matters (last_local and global runs differ), and each client of the stack gets its own
    last local model: the runs of test_vectorized_gradma_matches_sequential_training would not agree
    if the stack's states were mixed up or dropped."""
    overrides = SMALL + ["algorithm.name=gradma_w", f"train.rounds={ROUNDS}", "engine.vectorize=true"]
    last_local = run(tmp_path, overrides, "last_local")
    global_anchor = run(tmp_path, overrides + ["algorithm.anchor_mode=global"], "global")
    assert last_local.summary["client_state_bytes"] > 0 == global_anchor.summary["client_state_bytes"]
    assert not torch.allclose(last_local.params, global_anchor.params, rtol=RTOL, atol=ATOL)
