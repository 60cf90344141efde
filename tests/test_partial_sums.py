"""engine.partial_sums: each worker sends one exact sum per upload name; the run has the same bits
whatever the number of workers and the engine, and stays within float32 rounding of the per-client path."""
import pytest
import torch

import rayfed
from rayfed.algorithms.summed_uploads import SummedUploads
from rayfed.exact_sum import ExactSum
from tests.test_cli import fails_cleanly, in_tmp  # noqa: F401 (a fixture)
from tests.test_cli import main
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run, run
from tests.test_plugins import forget_plugins, write

PARTIAL = ["engine.partial_sums=true"]
# Measured: over these runs (3-4 rounds, |w| ~ 1) the final models of the two paths differ by at most
# 1.2e-7 (the per-client path rounds each of S float32 additions; partial sums round once). 1e-5 leaves
# room for more rounds and algorithms whose server optimizer divides by small second moments.
TOLERANCE = 1e-5
# The traffic figures are per client in both paths.
PER_CLIENT_METRICS = ("round", "num_participants", "bytes_up", "bytes_down", "bits_up", "bits_down")


def assert_close_to_per_client(reference, summed):
    assert torch.allclose(reference.params, summed.params, rtol=0, atol=TOLERANCE)
    assert torch.allclose(reference.buffers, summed.buffers, rtol=0, atol=TOLERANCE)
    for plain, partial in zip(reference.history, summed.history, strict=True):
        assert {key: plain[key] for key in PER_CLIENT_METRICS} == {key: partial[key] for key in PER_CLIENT_METRICS}
    # Round 1 trains from the same model either way.
    assert reference.history[0]["train_loss"] == summed.history[0]["train_loss"]


@pytest.mark.slow
def test_one_two_three_workers_local_and_ray_give_the_same_bits(tmp_path, ray_cluster, cifar_lenet):
    """LeNet-5 with BatchNorm (its n_i-weighted buffers go through the exact sum too) and dropout."""
    overrides = cifar_lenet + PARTIAL + ["algorithm.agg_weighting=num_samples", "train.rounds=3"]
    local = run(tmp_path, overrides + ["engine.backend=local"], "local")
    assert local.buffers.numel() > 0
    for workers in (2, 3):
        assert_same_run(local, run(tmp_path, overrides + [*ON_RAY, f"engine.num_workers={workers}"],
                                   f"ray{workers}"))
    per_client = run(tmp_path, [o for o in overrides if o not in PARTIAL] + ["engine.backend=local"], "per_client")
    assert_close_to_per_client(per_client, local)


@pytest.mark.parametrize("algorithm", ["fedavgm", "fedadam", "mimelite", "fedgate", "moon", "stem", "mifam"])
def test_linear_algorithms_stay_within_float32_rounding_of_the_per_client_path(tmp_path, algorithm):
    overrides = SYNTHETIC_MLP + ["engine.backend=local", f"algorithm.name={algorithm}", "train.rounds=3"]
    assert_close_to_per_client(run(tmp_path, overrides, "per_client"), run(tmp_path, overrides + PARTIAL, "summed"))


def test_vectorized_clients_are_summed_as_stacked_rows(tmp_path):
    overrides = [o for o in SYNTHETIC_MLP if not o.startswith("model.")] + [
        "model.name=logreg", "engine.backend=local", "engine.vectorize=true", "algorithm.agg_weighting=num_samples"]
    summed = run(tmp_path, overrides + PARTIAL, "summed")
    assert summed.summary["vectorized"]
    assert_close_to_per_client(run(tmp_path, overrides, "per_client"), summed)


LINEAR_PLUGIN = """
    import rayfed
    from rayfed.algorithms.base import local_sgd, weighted_average
    from rayfed.algorithms.fedavg import FedAvgMState
    from rayfed.algorithms.server_optimizer import ServerOptimizerState

    class Averaging(rayfed.Algorithm):
        state_classes = (FedAvgMState, ServerOptimizerState)
        keeps_client_state = False
        linear_uploads = {linear}

        def __init__(self, params, context):
            self.lr_local, self.weighting = params.lr_local, params.agg_weighting

        def server_init(self, params, num_clients):
            return params.clone()

        def broadcast(self, state):
            return {{"params": state}}

        def global_params(self, state):
            return state

        def client_train(self, task, down, client_state):
            local, loss = local_sgd(task, down["params"], self.lr_local)
            return rayfed.Upload({{"change": local - down["params"]}}, task.num_samples, {{"train_loss": loss}}), None

        def server_step(self, state, uploads, round_info):
            {server_step}

    rayfed.register_algorithm("{name}")(Averaging)
    """


def plugin(tmp_path, name, linear, server_step):
    return write(tmp_path, f"{name}.py", LINEAR_PLUGIN.format(name=name, linear=linear, server_step=server_step))


def test_a_plugin_algorithm_opts_in_with_linear_uploads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = plugin(tmp_path, "averaging", True,
                  'return state + weighted_average(uploads, "change", self.weighting, round_info.weights), {}')
    overrides = SYNTHETIC_MLP[:-1] + [f"plugins=[{spec}]", "algorithm.name=averaging", "engine.backend=local"]
    try:
        assert_close_to_per_client(run(tmp_path, overrides, "per_client"), run(tmp_path, overrides + PARTIAL, "summed"))
    finally:
        forget_plugins()


def test_a_linear_algorithm_that_reads_the_uploads_otherwise_is_stopped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = plugin(tmp_path, "peeking", True, 'return state + next(iter(uploads.values())).tensors["change"], {}')
    try:
        with pytest.raises(TypeError, match="^engine.partial_sums: the server holds the sum of the round's uploads, "
                                            "not each one; an algorithm with linear_uploads = True may read them only "
                                            "through weighted_average$"):
            run(tmp_path, SYNTHETIC_MLP[:-1] + [f"plugins=[{spec}]", "algorithm.name=peeking", "engine.backend=local"]
                + PARTIAL, "run")
    finally:
        forget_plugins()


def test_summed_uploads_answer_only_weighted_average():
    uploads = SummedUploads({"change": ExactSum((2,)).add(torch.tensor([[1.0, 2.0], [3.0, 5.0]]), [1, 3])},
                            "num_samples", num_clients=2, num_samples=4)
    assert torch.equal(rayfed.algorithms.base.weighted_average(uploads, "change", "num_samples"),
                       torch.tensor([2.5, 4.25]))
    for read in (len, iter, lambda u: u[0], lambda u: u.values(), lambda u: 0 in u):
        with pytest.raises(TypeError, match="^engine.partial_sums: the server holds the sum"):
            read(uploads)
    with pytest.raises(ValueError, match="^engine.partial_sums: the workers summed the uploads with "
                                         "agg_weighting=num_samples, but the server step averages them with uniform$"):
        uploads.average("change", "uniform", None)
    with pytest.raises(ValueError, match="^engine.partial_sums: the selector's per-client weights cannot apply"):
        uploads.average("change", "num_samples", {0: 0.5, 1: 0.5})
    with pytest.raises(KeyError, match="no upload named 'other'"):
        uploads.average("other", "num_samples", None)


LINEAR = ("fedavgm, fedavg, fedprox, fedproxm, fedcom, fedpaq, fedavg_nesterov, fedcomgate, fedgate, fedlalr, "
          "local_amsgrad, fedmlbm, fedmlb, "
          "fedmos, fedadam, fedyogi, fedadagrad, fedams_v1, fedams_v2, lafedopt, mifa, mifam, mimelite, moonm, moon, stem")


@pytest.mark.parametrize("overrides, line", [
    (["algorithm.name=scaffold"], "engine.partial_sums does not apply to scaffold, whose server step reads each "
                                  f"client's upload (it applies to: {LINEAR})"),
    (["algorithm.name=gradma_s"], "engine.partial_sums does not apply to gradma_s, whose server step reads each "
                                  f"client's upload (it applies to: {LINEAR})"),
    (["algorithm.name=fedlalr", "algorithm.vhat_agg=max"],
     "algorithm.vhat_agg=max (Algorithm 3) takes the largest of each client's v_hat, which engine.partial_sums=true "
     "does not hand the server: use vhat_agg=mean"),
    (["algorithm.name=fedlalr", "algorithm.trace_v_hat=true"],
     "algorithm.trace_v_hat logs each client's trace, which engine.partial_sums=true does not hand the server"),
    (["algorithm.name=fedcom", "compression.name=qsgd"],
     "engine.partial_sums needs compression.name=identity, not qsgd: compressed messages are decoded one by one on "
     "the server"),
    (["selection.selector=md"], "engine.partial_sums needs selection.selector=uniform, not md: its per-client "
                                "aggregation weights are not integers the workers can sum exactly"),
    (["selection.selector=ucs"], "engine.partial_sums needs selection.selector=uniform, not ucs: its per-client "
                                 "aggregation weights are not integers the workers can sum exactly"),
    (["train.round_policy=async_buffered"], "engine.partial_sums does not apply with "
                                            "train.round_policy=async_buffered: the server buffers each client's "
                                            "upload until it arrives"),
])
def test_what_partial_sums_refuse_is_one_line_before_any_work(overrides, line, in_tmp, capsys):  # noqa: F811
    with pytest.raises(rayfed.ConfigError) as refused:
        rayfed.load_config(None, overrides + PARTIAL)
    assert str(refused.value) == line
    err = fails_cleanly(capsys, ["run", *overrides, *PARTIAL, "engine.backend=local"], line)
    assert err == f"rayfed: error: {line}\n"
