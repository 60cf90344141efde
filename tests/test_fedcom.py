"""FedCOM, FedGATE, FedCOMGATE and SCAFFOLD against specs/fedcom.md §7 (T-A*, T-B*) on the spec's
float64 quadratic testbed, the worker's compression and reply steps written out by hand."""
import numpy as np
import pytest
import torch

from rayfed.algorithms.base import RoundInfo
from rayfed.compression import QSGD, RandK, TopK
from rayfed.seeding import Purpose, torch_generator
from tests.fakes import ScriptedTask, make

F64 = torch.float64
M, DIM = 10, 20


class QuadraticClient(ScriptedTask):
    """f_j(w) = 1/2 (w - c_j)' H_j (w - c_j), H_j = A A'/d + 0.5 I (the spec's testbed), exact gradients
    (sigma = 0), each one recorded."""

    def __init__(self, j, steps=10):
        super().__init__([torch.zeros(DIM, dtype=F64)])
        generator = torch.Generator().manual_seed(40 + j)
        root = torch.randn(DIM, DIM, generator=generator, dtype=F64)
        self.H = root @ root.T / DIM + 0.5 * torch.eye(DIM, dtype=F64)
        self.c = 3 * torch.randn(DIM, generator=generator, dtype=F64)
        self.steps = steps
        self.gradients = []

    def loss_and_grad(self, params, batch):
        grad = self.H @ (params - self.c)
        self.gradients.append(grad.clone())
        return (0.5 * (params - self.c) @ self.H @ (params - self.c)).detach(), grad


def optimum(clients):
    H = sum(client.H for client in clients)
    return torch.linalg.solve(H, sum(client.H @ client.c for client in clients))


class Run:
    def __init__(self):
        self.params, self.states, self.messages, self.averages, self.updates = [], [], [], [], []


def play(algorithm, rounds, compressor=None, sampled=None, steps=10, seed=0, stop_above=None, downlink=None):
    """Rounds of `algorithm` on the testbed, as the worker and server run them: each client's update
    compressed from its own stream, the server aggregating what it decodes, then the reply."""
    clients = [QuadraticClient(j, steps) for j in range(M)]
    state = algorithm.server_init(torch.zeros(DIM, dtype=F64), M)
    client_states, run = {}, Run()
    name = algorithm.compressed_upload
    for round in range(rounds):
        chosen = sorted(sampled(round)) if sampled else list(range(M))
        down = algorithm.broadcast(state)
        uploads, sent, raw = {}, {}, {}
        for j in chosen:
            upload, client_states[j] = algorithm.client_train(clients[j], down, client_states.get(j))
            if name is not None:
                raw[j] = upload.tensors[name]
                if compressor is not None:
                    generator = torch_generator(seed, Purpose.COMPRESSION, round, j)
                    upload.tensors[name] = compressor.decompress(compressor.compress(raw[j], generator), DIM)
                sent[j] = upload.tensors[name]
            uploads[j] = upload
        compress_down = None
        if downlink is not None:
            generator = torch_generator(seed, Purpose.COMPRESSION_DOWNLINK, round)
            compress_down = lambda vector: downlink.decompress(downlink.compress(vector, generator), DIM)  # noqa: E731
        state, _ = algorithm.server_step(state, uploads, RoundInfo(round, tuple(chosen), M, downlink=compress_down))
        if algorithm.replies:
            reply = algorithm.server_reply(state)
            for j in chosen:
                client_states[j] = algorithm.client_finish(client_states[j], reply, sent[j])
            run.averages.append(reply["average"])
        run.params.append(algorithm.global_params(state))
        run.states.append(dict(client_states))
        run.messages.append(sent)
        run.updates.append(raw)
        if stop_above is not None and run.params[-1].norm() > stop_above:
            break
    return run, clients


def tracking(run, round, j):
    return run.states[round][j].tracking


# ---- equivalences (T-A1 .. T-A8) ----

@pytest.mark.parametrize("gamma", [1.0, 0.6])
def test_a1_a2_fedcom_with_identity_moves_to_the_gamma_mix_of_the_local_models(gamma):
    fedcom = make("fedcom", lr_local=0.02, lr_global=gamma)
    clients = [QuadraticClient(j) for j in range(M)]
    w = torch.zeros(DIM, dtype=F64)
    run, _ = play(fedcom, rounds=3)
    for params in run.params:
        local = []
        for client in clients:
            x = w.clone()
            for _ in range(10):
                x = x - 0.02 * client.H @ (x - client.c)
            local.append(x)
        w = (1 - gamma) * w + gamma * torch.stack(local).mean(0)
        torch.testing.assert_close(params, w, rtol=0, atol=1e-12)


def test_a3_one_local_step_is_minibatch_sgd_and_tracks_the_gradient_spread():
    for name in ("fedcom", "fedcomgate"):
        algorithm = make(name, lr_local=0.02, lr_global=0.7)
        run, clients = play(algorithm, rounds=3, steps=1)
        w = torch.zeros(DIM, dtype=F64)
        for round, params in enumerate(run.params):
            grads = torch.stack([client.H @ (w - client.c) for client in clients])
            w = w - 0.02 * 0.7 * grads.mean(0)
            torch.testing.assert_close(params, w, rtol=0, atol=1e-12)
            if name == "fedcomgate":
                for j in range(M):
                    # delta_j^(r+1) = g_j^(r) - mean_i g_i^(r): the deltas cancel in the average
                    torch.testing.assert_close(tracking(run, round, j), grads[j] - grads.mean(0), rtol=0, atol=1e-12)


def test_a5_fedgate_is_scaffold_under_full_participation():
    gate, _ = play(make("fedgate", lr_local=0.02, lr_global=1.0), rounds=30)
    scaffold, _ = play(make("scaffold", lr_local=0.02, lr_global=1.0), rounds=30)
    for a, b in zip(gate.params, scaffold.params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a6_round_0_of_fedcomgate_is_fedcoms_with_the_same_draws():
    gate, _ = play(make("fedcomgate", lr_local=0.02, lr_global=1.0), rounds=1, compressor=QSGD(2))
    com, _ = play(make("fedcom", lr_local=0.02, lr_global=1.0), rounds=1, compressor=QSGD(2))
    torch.testing.assert_close(gate.params[0], com.params[0], rtol=0, atol=1e-12)


def test_a7_a8_tracking_is_the_sum_of_own_messages_minus_averages():
    alpha, steps = 0.5, 10
    sampled = lambda round: np.random.default_rng(round).choice(M, 5, replace=False).tolist()
    run, clients = play(make("fedcomgate", lr_local=0.02, lr_global=1.0, alpha=alpha), rounds=6, compressor=QSGD(4),
                        sampled=sampled)
    expected = {j: torch.zeros(DIM, dtype=F64) for j in range(M)}
    for round in range(6):
        for j, message in run.messages[round].items():
            expected[j] = expected[j] + alpha / steps * (message - run.averages[round])
            torch.testing.assert_close(tracking(run, round, j), expected[j], rtol=0, atol=1e-12)
    identity, clients = play(make("fedgate", lr_local=0.02, lr_global=1.0), rounds=3)
    for round in range(1, 3):
        # with Q = identity and k = 1: delta_j^(r+1) = gbar_j^(r) - mean_i gbar_i^(r)
        gbar = torch.stack([torch.stack(client.gradients[round * steps:(round + 1) * steps]).mean(0) for client in clients])
        for j in range(M):
            torch.testing.assert_close(tracking(identity, round, j), gbar[j] - gbar.mean(0), rtol=0, atol=1e-12)


# ---- invariants (T-A9, T-A10, T-A13) ----

def zero_sum_gap(run, round):
    deltas = torch.stack([state.tracking for state in run.states[round].values()])
    return deltas.sum(0).abs().max() / (1e-9 * M * (1 + deltas.abs().max()))


def test_a9_the_tracking_vectors_sum_to_zero_with_any_compressor_and_sampling():
    sampled = lambda round: np.random.default_rng(round + 7).choice(M, 5, replace=False).tolist()
    for alpha in (1.0, 0.3):
        run, _ = play(make("fedcomgate", lr_local=0.02, lr_global=1.0, alpha=alpha), rounds=8, compressor=QSGD(2),
                      sampled=lambda r: list(range(M)) if r == 0 else sampled(r))
        assert all(zero_sum_gap(run, round) <= 1 for round in range(8))
    # the rule's own compressed message is what keeps the sum at 0: the uncompressed one does not
    broken, _ = play(make("fedcomgate", lr_local=0.02, lr_global=1.0, own_term="uncompressed"), rounds=3,
                     compressor=QSGD(2))
    assert zero_sum_gap(broken, 2) > 1
    # nor with a compressed reply: sum_j (M_j - Q(Delta_bar)) = K (Delta_bar - Q(Delta_bar))
    downlink, _ = play(make("fedcomgate", lr_local=0.02, lr_global=1.0), rounds=3, compressor=QSGD(2),
                       downlink=QSGD(2))
    assert zero_sum_gap(downlink, 2) > 1


def test_a_compressed_reply_moves_the_model_and_the_tracking_by_the_same_decoded_value():
    run, _ = play(make("fedcomgate", lr_local=0.02, lr_global=0.5), rounds=2, compressor=QSGD(4), downlink=QSGD(4))
    generator = torch_generator(0, Purpose.COMPRESSION_DOWNLINK, 1)
    exact = torch.stack(list(run.messages[1].values())).mean(0)
    decoded = QSGD(4).decompress(QSGD(4).compress(exact, generator), DIM)
    torch.testing.assert_close(run.averages[1], decoded, rtol=0, atol=1e-12)
    torch.testing.assert_close(run.params[1], run.params[0] - 0.02 * 0.5 * decoded, rtol=0, atol=1e-12)
    for j in range(M):
        torch.testing.assert_close(tracking(run, 1, j) - tracking(run, 0, j),
                                   (run.messages[1][j] - decoded) / 10, rtol=0, atol=1e-12)


def test_a10_clients_not_sampled_keep_their_state_bit_for_bit():
    sampled = lambda round: [0, 1, 2] if round % 2 else [3, 4, 5, 6]
    run, _ = play(make("fedcomgate", lr_local=0.02, lr_global=1.0), rounds=4, compressor=QSGD(4), sampled=sampled)
    for round in range(1, 4):
        for j in run.states[round - 1]:
            if j not in sampled(round):
                assert run.states[round][j] is run.states[round - 1][j]


def test_a13_top_k_with_memory_keeping_everything_is_fedgate_and_the_memory_is_the_scaled_tracking():
    gate, _ = play(make("fedgate", lr_local=0.02, lr_global=1.0), rounds=5)
    full, _ = play(make("fedcomgate", lr_local=0.02, lr_global=1.0, memory=True), rounds=5, compressor=TopK(DIM))
    for a, b in zip(gate.params, full.params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert torch.stack([s.memory for s in full.states[-1].values()]).sum(0).abs().max() < 1e-10
    sparse, _ = play(make("fedcomgate", lr_local=0.02, lr_global=1.0, memory=True), rounds=5, compressor=TopK(4))
    for states in sparse.states:
        for state in states.values():
            # delta_j = nu_j / (eta tau) in model units: nu is kept in update units (divided by eta)
            torch.testing.assert_close(state.tracking, state.memory / 10, rtol=0, atol=1e-12)


# ---- behaviour (T-A14, T-A15) ----

def distance_to_optimum(run, clients):
    return (run.params[-1] - optimum(clients)).norm().item()


def test_a14_tracking_removes_client_drift_and_plain_local_sgd_stalls():
    half = lambda round: np.random.default_rng(round).choice(M, 5, replace=False).tolist()
    for name, compressor, sampled, converges in (("fedgate", None, None, True), ("fedavg", None, None, False),
                                                ("fedcomgate", QSGD(2), None, True), ("fedcomgate", QSGD(2), half, True),
                                                ("fedcom", QSGD(2), None, False)):
        run, clients = play(make(name, lr_local=0.02, lr_global=1.0), rounds=400, compressor=compressor,
                            sampled=sampled)
        distance = distance_to_optimum(run, clients)
        assert (distance < 1e-8) if converges else (distance > 1e-2), (name, sampled, distance)
        if name == "fedgate":
            gate, gate_clients = run, clients
    optimal = optimum(gate_clients)
    for j, client in enumerate(gate_clients):
        # at the fixed point delta_j is client j's gradient at w*
        torch.testing.assert_close(tracking(gate, -1, j), client.H @ (optimal - client.c), rtol=0, atol=1e-9)


def test_a15_tracking_with_alpha_1_diverges_for_q_above_1_and_damping_fixes_it():
    rand8 = RandK(8)                                        # q = 20/8 - 1 = 1.5
    diverging, _ = play(make("fedcomgate", lr_local=0.02, lr_global=1.0), rounds=1500, compressor=rand8,
                        stop_above=1e6)
    assert diverging.params[-1].norm() > 1e6
    damped, clients = play(make("fedcomgate", lr_local=0.02, lr_global=1.0, alpha=1 / 2.5), rounds=1500,
                           compressor=rand8)
    assert distance_to_optimum(damped, clients) < 1e-8


# ---- SCAFFOLD against the spec's float64 reference (§2.7) ----

def test_scaffold_is_the_specs_option_ii_under_sampling():
    lr, gamma, steps = 0.02, 0.8, 10
    sampled = lambda round: np.random.default_rng(round + 3).choice(M, 4, replace=False).tolist()
    run, clients = play(make("scaffold", lr_local=lr, lr_global=gamma), rounds=5, sampled=sampled)
    x, c = torch.zeros(DIM, dtype=F64), torch.zeros(DIM, dtype=F64)
    controls = [torch.zeros(DIM, dtype=F64) for _ in range(M)]
    for round in range(5):
        dys, dcs = [], []
        for j in sorted(sampled(round)):
            y = x.clone()
            for _ in range(steps):
                y = y - lr * (clients[j].H @ (y - clients[j].c) - controls[j] + c)
            new = controls[j] - c + (x - y) / (steps * lr)
            dys.append(y - x)
            dcs.append(new - controls[j])
            controls[j] = new
        x = x + gamma * torch.stack(dys).mean(0)
        c = c + torch.stack(dcs).sum(0) / M
        torch.testing.assert_close(run.params[round], x, rtol=0, atol=1e-12)


# ---- runs: bits (T-B1, T-B2) and the heterogeneity diagnostic (T-D1) ----

RUN = ["engine.backend=local", "data.dataset=digits", "data.partition=shards", "data.num_clients=20",
       "train.clients_per_round=20", "train.rounds=3", "train.eval_every=3", "model.name=relu_mlp",
       "model.hidden_sizes=[16]", "train.local_steps=4", "train.batch_size=20", "algorithm.lr_local=0.1"]


def test_b1_uplink_bits_per_algorithm(tmp_path):
    import rayfed
    bits = {}
    for name, extra in (("fedavg", []), ("fedgate", []), ("scaffold", []),
                        ("fedcomgate", ["compression.name=affine"]), ("fedpaq", ["compression.name=affine"])):
        result = rayfed.run(rayfed.load_config(None, RUN + [f"algorithm.name={name}", *extra]),
                            run_dir=tmp_path / name, progress=False)
        d = result.summary["num_params"]
        bits[name] = [(m["bits_up"], m["bits_down"]) for m in result.history]
        for metrics in result.history:
            assert metrics["bits_up_total"] == sum(up for up, _ in bits[name][:metrics["round"]])
    per_client = 32 * d
    assert all(up == 20 * per_client for up, _ in bits["fedavg"] + bits["fedgate"])
    assert all(up == 20 * 2 * per_client for up, _ in bits["scaffold"])               # FedGATE sends half
    assert all(up == 20 * (8 * d + 96) for up, _ in bits["fedcomgate"] + bits["fedpaq"])
    assert all(down == 20 * per_client for _, down in bits["fedavg"] + bits["fedpaq"])
    assert all(down == 20 * 2 * per_client for _, down in bits["scaffold"])
    # every client takes part: Option I, the trackers send Delta_bar alone (clients keep the model)
    assert all(down == 20 * per_client for _, down in bits["fedgate"] + bits["fedcomgate"])


def test_a12_option_i_and_option_ii_train_the_same_model_and_differ_in_downlink(tmp_path):
    import rayfed
    runs = {option: rayfed.run(rayfed.load_config(None, RUN + ["algorithm.name=fedcomgate", "compression.name=qsgd",
                                                              f"algorithm.client_replicas={option}"]),
                               run_dir=tmp_path / option, progress=False)
            for option in ("true", "false")}
    assert torch.equal(runs["true"].params, runs["false"].params)
    d = runs["true"].summary["num_params"]
    assert [m["bits_down"] for m in runs["false"].history] == [20 * 64 * d] * 3
    assert [m["bits_down"] for m in runs["true"].history] == [20 * 32 * d] * 3
    compressed_reply = rayfed.run(rayfed.load_config(None, RUN + ["algorithm.name=fedcomgate", "compression.name=qsgd",
                                                                  "compression.levels=2", "compression.downlink=true"]),
                                  run_dir=tmp_path / "downlink", progress=False)
    assert [m["bits_down"] for m in compressed_reply.history] == [20 * (32 + d * 3)] * 3       # Option I: Q(Delta_bar)
    with pytest.raises(rayfed.ConfigError, match="compression.downlink compresses FedCOMGATE's reply"):
        rayfed.load_config(None, RUN + ["algorithm.name=fedcom", "compression.name=qsgd", "compression.downlink=true"])
    with pytest.raises(rayfed.ConfigError, match="client_replicas=true \\(Option I\\) needs every client"):
        rayfed.load_config(None, RUN + ["algorithm.name=fedgate", "algorithm.client_replicas=true",
                                        "train.clients_per_round=10"])


def test_d1_gradient_similarity_is_a_cosine_matrix_and_shards_are_less_alike_than_iid(tmp_path):
    import rayfed
    means = {}
    for partition in ("iid", "shards"):
        result = rayfed.run(rayfed.load_config(None, RUN + [f"data.partition={partition}", "algorithm.name=fedavg",
                                                             "train.similarity_clients=20"]),
                            run_dir=tmp_path / partition, progress=False)
        last = result.history[-1]
        matrix = np.array(last["gradient_similarity"])
        assert matrix.shape == (20, 20) and np.array_equal(matrix, matrix.T) and np.all(np.diag(matrix) == 1)
        assert np.all(np.abs(matrix) <= 1)
        assert "gradient_similarity" not in result.history[0]                     # only at evaluations
        means[partition] = last["gradient_similarity_mean"]
    assert means["iid"] > means["shards"] + 0.2


# ---- T-A11, T-A16: sampling and unbiased aggregation ----

def test_a11_each_round_samples_k_distinct_clients_uniformly():
    from scipy.stats import chisquare

    from rayfed.selection import select
    from rayfed.seeding import numpy_rng
    counts = np.zeros(M)
    for round in range(10_000):
        chosen = select("uniform", np.arange(M), np.full(M, 10), 5, numpy_rng(0, Purpose.SAMPLE_CLIENTS, round))
        assert len(set(chosen.clients.tolist())) == len(chosen.clients) == 5
        counts[chosen.clients] += 1
    assert chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize("name", ["fedcom", "fedcomgate"])
def test_a16_the_compressed_aggregate_is_unbiased(name):
    """The same local training, only the compressor redrawn: the mean next model is the uncompressed one."""
    from rayfed.algorithms.base import Upload
    algorithm = make(name, lr_local=0.02, lr_global=1.0)
    state = algorithm.server_init(torch.zeros(DIM, dtype=F64), M)
    updates = {}
    for j in range(M):
        upload, _ = algorithm.client_train(QuadraticClient(j), algorithm.broadcast(state), None)
        updates[j] = upload.tensors[algorithm.compressed_upload]
    exact = algorithm.server_step(state, {j: Upload({algorithm.compressed_upload: u}, 10) for j, u in updates.items()},
                                  RoundInfo(0, tuple(range(M)), M))[0].params
    compressor, draws = QSGD(2), []
    for repetition in range(5000):
        uploads = {j: Upload({algorithm.compressed_upload: compressor.decompress(
            compressor.compress(u, torch_generator(repetition, Purpose.COMPRESSION, 0, j)), DIM)}, 10)
            for j, u in updates.items()}
        draws.append(algorithm.server_step(state, uploads, RoundInfo(0, tuple(range(M)), M))[0].params)
    draws = torch.stack(draws)
    z = (draws.mean(0) - exact) / (draws.std(0) / np.sqrt(len(draws)))
    assert z.abs().max() <= 4.5


def test_the_run_logs_the_tracking_diagnostics_and_they_show_the_zero_sum(tmp_path):
    """§3.4 at evaluations, from every worker's clients: ||sum_j delta_j|| is float32 rounding with the
    paper's own term, and not with the uncompressed one."""
    import rayfed
    sampled = RUN + ["train.clients_per_round=10", "algorithm.name=fedcomgate", "compression.name=qsgd",
                     "train.rounds=4", "train.eval_every=2"]
    runs = {term: rayfed.run(rayfed.load_config(None, sampled + [f"algorithm.own_term={term}"]),
                             run_dir=tmp_path / term, progress=False).history for term in ("compressed", "uncompressed")}
    for term, history in runs.items():
        logged = [m for m in history if "tracking_sum_norm" in m]
        assert [m["round"] for m in logged] == [2, 4]
        for metrics in logged:
            ratio = metrics["tracking_sum_norm"] / metrics["tracking_max_norm"]
            assert (ratio < 1e-5) if term == "compressed" else (ratio > 1e-2), (term, ratio)
