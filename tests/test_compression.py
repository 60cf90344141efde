"""The compressors against specs/fedcom.md §7 (T-C1 to T-C8) and the bit counts of §3.3."""
import math

import numpy as np
import pytest
import torch

from rayfed.compression import QSGD, Affine, AffineStochastic, Identity, PerTensor, RandK, TopK
from rayfed.seeding import Purpose, torch_generator

D = 1000
DRAWS = 20_000
F64 = torch.float64


def sample_vectors():
    generator = torch.Generator().manual_seed(0)
    gaussian = torch.randn(D, generator=generator, dtype=F64)
    one_hot = torch.zeros(D, dtype=F64)
    one_hot[17] = -2.5
    sparse = torch.zeros(D, dtype=F64)
    sparse[torch.randperm(D, generator=generator)[:10]] = torch.randn(10, generator=generator, dtype=F64)
    return {"gaussian": gaussian, "one_hot": one_hot, "constant": torch.full((D,), 0.7, dtype=F64),
            "sparse": sparse}


UNBIASED = {"qsgd1": QSGD(1), "qsgd4": QSGD(4), "qsgd16": QSGD(16), "rand100": RandK(100),
            "affine_stochastic2": AffineStochastic(2), "affine_stochastic4": AffineStochastic(4),
            "affine_stochastic8": AffineStochastic(8)}


def quantum(compressor, x):
    """The distance between the two values a coordinate may be sent as."""
    if isinstance(compressor, QSGD):
        return x.norm() / compressor.levels
    if isinstance(compressor, AffineStochastic):
        return (x.max() - x.min()) / compressor.top
    return (D / compressor.count(D)) * x.abs().max()


def draws(compressor, x, count=DRAWS, seed=1):
    generator = torch.Generator().manual_seed(seed)
    # One vector a call (the operator's statistics are the whole vector's), so each call's overhead counts:
    # inference mode spares it autograd's bookkeeping, ~10% of the 80,000 calls a C1/C2 test makes.
    with torch.inference_mode():
        return torch.stack([compressor.decompress(compressor.compress(x, generator), D) for _ in range(count)])


@pytest.mark.parametrize("name", sorted(UNBIASED))
def test_c1_c2_unbiased_operators_have_mean_x_and_variance_within_q(name):
    compressor = UNBIASED[name]
    for kind, x in sample_vectors().items():
        samples = draws(compressor, x)
        mean, variance = samples.mean(0), samples.var(0)
        random = variance > 0
        z = (mean[random] - x[random]) / torch.sqrt(variance[random] / DRAWS)
        assert torch.all(z.abs() <= 5.5), (name, kind, z.abs().max())
        # No spread seen: the coordinate is exact, or it sits so close to a level that not one of the draws
        # leaving it is a plausible outcome (probability e^-7 or more).
        stuck = (samples[0, ~random] - x[~random]).abs()
        assert torch.all(DRAWS * stuck <= 7 * quantum(compressor, x)), (name, kind)
        ratios = ((samples - x) ** 2).sum(1) / (x ** 2).sum()
        rho, standard_error = ratios.mean().item(), (ratios.std() / math.sqrt(DRAWS)).item()
        assert rho <= compressor.variance_bound(D) + 4 * standard_error, (name, kind)
        if name.startswith("qsgd"):
            a = compressor.levels * x.abs() / x.norm()
            p = a - a.floor()
            exact = (p * (1 - p)).sum().item() / compressor.levels ** 2
            assert abs(rho - exact) <= 4 * standard_error + 1e-12, (name, kind, rho, exact)
        if name == "rand100":
            assert abs(rho - (D / 100 - 1)) <= 4 * standard_error, (kind, rho)


ALL = {**UNBIASED, "identity": Identity(), "top100": TopK(100), "affine8": Affine(8), "noisy": Affine(8, 4)}


@pytest.mark.parametrize("name", sorted(ALL))
def test_c3_c4_zero_maps_to_zero_and_operators_are_positively_homogeneous(name):
    compressor = ALL[name]
    zero = compressor.decompress(compressor.compress(torch.zeros(D, dtype=F64), torch.Generator().manual_seed(0)), D)
    assert torch.equal(zero, torch.zeros(D, dtype=F64))
    x = sample_vectors()["gaussian"]
    reference = compressor.decompress(compressor.compress(x, torch.Generator().manual_seed(3)), D)
    for a in (0.5, 3.0):
        scaled = compressor.decompress(compressor.compress(a * x, torch.Generator().manual_seed(3)), D)
        torch.testing.assert_close(scaled, a * reference, rtol=1e-6, atol=1e-12)


def test_c3_identity_is_the_vector_itself_at_32_bits_a_coordinate():
    x = sample_vectors()["gaussian"]
    message = Identity().compress(x)
    assert message.bits == 32 * D and Identity().decompress(message, D) is x


def test_c5_top_k_keeps_the_k_largest_and_is_contractive():
    x = sample_vectors()["gaussian"]
    for kept in (1, 10, 100, 999):
        y = TopK(kept).decompress(TopK(kept).compress(x), D)
        chosen = set(torch.nonzero(y).flatten().tolist())
        assert chosen == set(torch.argsort(x.abs(), descending=True)[:kept].tolist())
        assert ((x - y) ** 2).sum() <= (1 - kept / D) * (x ** 2).sum()
    ties = torch.tensor([1.0, -2.0, 2.0, 0.5, -2.0], dtype=F64)
    assert TopK(2).compress(ties).parts["indices"].tolist() == [1, 2]              # lower index wins a tie


def test_c6_the_affine_quantizer_is_the_authors():
    x = sample_vectors()["gaussian"].float()
    quantizer = Affine(8)
    message = quantizer.compress(x)
    codes = message.parts["codes"]
    assert codes.dtype == torch.int8 and codes.min() >= -128 and codes.max() <= 127
    scale = message.parts["header"][0]
    assert (quantizer.decompress(message, D) - x).abs().max() <= scale * (1 + 1e-6)
    assert torch.equal(quantizer.compress(x).parts["codes"], codes)                  # deterministic
    assert message.bits == 8 * D + 96
    constant = quantizer.compress(torch.full((D,), 0.7))
    assert message.parts["header"].isfinite().all() and constant.parts["header"][0] == pytest.approx(0.001)
    torch.testing.assert_close(quantizer.decompress(constant, D), torch.full((D,), 0.7))


def test_affine_noise_shifts_every_coordinate_by_one_zero_mean_multiple_of_the_scale():
    x = sample_vectors()["gaussian"]
    plain = Affine(8).decompress(Affine(8).compress(x), D)
    noisy = Affine(8, 4)
    generator = torch.Generator().manual_seed(5)
    shifts = []
    for _ in range(4000):
        message = noisy.compress(x, generator)
        shift = (noisy.decompress(message, D) - plain) / message.parts["header"][0]
        inside = (message.parts["codes"] > -128) & (message.parts["codes"] < 127)      # not clipped
        assert torch.allclose(shift[inside], shift[inside][0].round().expand(int(inside.sum())), atol=1e-6)
        shifts.append(shift[inside][0].round().item())
    values = np.array(shifts)
    assert set(values) <= set(range(-4, 5)) and abs(values.mean()) <= 4 * values.std() / math.sqrt(len(values))
    assert values.var() == pytest.approx(4 * 5 / 3, rel=0.1)                         # N_z (N_z + 1) / 3


def test_c7_and_the_worked_example_bit_counts():
    """§3.3: the MLP 784-200-200-10 with biases, d = 199,210."""
    d = 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    assert d == 199_210
    x = torch.randn(d)
    assert Identity().compress(x).bits == 6_374_720
    assert Affine(8).compress(x).bits == 1_593_776
    assert QSGD(255).compress(x, torch.Generator().manual_seed(0)).bits == 1_792_922
    top = TopK(ratio=0.1).compress(x)
    assert top.parts["values"].numel() == 9_960 and top.bits == 637_440
    assert 0.1 - 64 / (32 * d) < top.bits / (32 * d) <= 0.1
    assert RandK(100).compress(x, torch.Generator().manual_seed(0)).bits == 6_400
    assert AffineStochastic(4).compress(x, torch.Generator().manual_seed(0)).bits == 4 * d + 64


def test_per_tensor_compression_pays_a_header_a_tensor_and_decodes_each_block():
    blocks = [(0, 300), (300, 310), (310, D)]
    x = sample_vectors()["gaussian"]
    per_tensor = PerTensor(Affine(8), blocks)
    message = per_tensor.compress(x, None)
    assert message.bits == 8 * D + 3 * 96
    decoded = per_tensor.decompress(message, D)
    for start, end in blocks:
        torch.testing.assert_close(decoded[start:end], Affine(8).decompress(Affine(8).compress(x[start:end]), end - start))
    top = PerTensor(TopK(5), blocks).compress(x, None)
    assert top.bits == 3 * 5 * 64


def test_c8_clients_draw_independent_compressions():
    """E||(1/m) sum_j Q(x_j)||^2 = ||x_bar||^2 + (1/m^2) sum_j E||Q(x_j) - x_j||^2 within 3% with each client's own
    stream (seed, round, client): shared streams would correlate the errors."""
    m, compressor = 10, RandK(100)
    generator = torch.Generator().manual_seed(9)
    xs = torch.randn(m, D, generator=generator, dtype=F64) + 1.0
    mean = xs.mean(0)
    errors = sum((D / 100 - 1) * (x ** 2).sum() for x in xs) / m ** 2
    expected = (mean ** 2).sum() + errors
    rounds = 2000
    total = 0.0
    for round in range(rounds):
        decoded = [compressor.decompress(compressor.compress(x, torch_generator(0, Purpose.COMPRESSION, round, j)), D)
                   for j, x in enumerate(xs)]
        total += (torch.stack(decoded).mean(0) ** 2).sum().item()
    assert total / rounds == pytest.approx(expected.item(), rel=0.03)
    shared = sum((torch.stack([compressor.decompress(compressor.compress(x, torch_generator(0, Purpose.COMPRESSION,
                                                                                            round, 0)), D)
                               for x in xs]).mean(0) ** 2).sum().item() for round in range(rounds)) / rounds
    assert shared > 1.1 * expected.item()                                            # the bug T-C8 catches


# ---- compression inside a run ----

SMALL = ["engine.backend=local", "algorithm.name=fedavg", "train.rounds=4", "train.eval_every=2", "model.name=logreg",
         "data.num_clients=12", "train.clients_per_round=4"]


def test_the_worker_sends_the_encoded_message_and_the_server_aggregates_what_it_decodes():
    import dataclasses

    import rayfed
    from rayfed.api import load_data
    from rayfed.compression import build_compressor, decode_upload
    from rayfed.engine.server import Server
    from rayfed.engine.worker import ClientWorker
    from rayfed.systems.clients import make_client_systems
    config = rayfed.load_config(None, SMALL + ["compression.name=qsgd", "compression.levels=2"])
    dataset, partition = load_data(config)
    worker = ClientWorker(config, (dataset.train_x, dataset.train_y), partition, dataset.input_shape,
                          dataset.num_classes)
    systems = dataclasses.replace(make_client_systems(config), client_sizes=partition.sizes)
    server = Server(config, (dataset.test_x, dataset.test_y), dataset.input_shape, dataset.num_classes, systems)
    plan = server.sample(0)
    sampled = plan.participants
    down = server.broadcast()
    packed = worker.train(0, down, sampled, 0.0)
    assert (set(packed.tensors) == {"model_change:norm", "model_change:levels"}
            and packed.tensors["model_change:levels"].dtype == torch.int8)
    compressor = build_compressor(config.compression, server.model.blocks)
    # the message carries the descent direction x - y, as FedCOM's clients send it
    decoded = [decode_upload({k: v[row] for k, v in packed.tensors.items()}, "model_change", compressor,
                             server.model.num_params)["model_change"] for row in range(len(sampled))]
    before = server.global_params().clone()
    metrics, _ = server.step(0, plan, packed)
    torch.testing.assert_close(server.global_params(), before - torch.stack(decoded).mean(0))
    d = server.model.num_params
    assert metrics["bits_up"] == len(sampled) * (32 + d * (1 + 2))                  # norm, sign + 2 level bits
    assert metrics["bytes_up"] == len(sampled) * (4 + d)                          # float32 norm, int8 levels
    assert metrics["bits_down"] == len(sampled) * 32 * d and metrics["compression_error"] > 0


def test_bits_are_32_a_float_uncompressed_and_the_totals_add_up(tmp_path):
    import rayfed
    result = rayfed.run(rayfed.load_config(None, SMALL), run_dir=tmp_path / "plain", progress=False)
    d = result.summary["num_params"]
    up_total = down_total = 0
    for metrics in result.history:
        assert metrics["bits_up"] == 8 * metrics["bytes_up"] == metrics["num_participants"] * 32 * d
        assert metrics["bits_down"] == 8 * metrics["bytes_down"]
        up_total, down_total = up_total + metrics["bits_up"], down_total + metrics["bits_down"]
        assert (metrics["bits_up_total"], metrics["bits_down_total"]) == (up_total, down_total)
    top = rayfed.run(rayfed.load_config(None, SMALL + ["compression.name=top_k", "compression.ratio=0.2"]),
                     run_dir=tmp_path / "top", progress=False)
    kept = int(0.2 * d / 2)
    assert all(m["bits_up"] == m["num_participants"] * 64 * kept for m in top.history)
    assert 0.2 - 64 / (32 * d) < top.history[0]["bits_up"] / (4 * 32 * d) <= 0.2


def test_compressed_runs_are_reproducible_and_resume_bitwise(tmp_path, monkeypatch):
    import rayfed
    from tests.test_checkpoint import interrupted
    from tests.test_engine_equivalence import assert_same_run
    overrides = SMALL + ["compression.name=rand_k", "compression.kept=20", "train.rounds=7",
                         "train.checkpoint_every=2"]
    whole = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "whole", progress=False)
    resumed = rayfed.resume(interrupted(tmp_path, overrides, monkeypatch), progress=False)
    assert_same_run(whole, resumed)
    other_seed = rayfed.run(rayfed.load_config(None, overrides + ["seed=1"]), run_dir=tmp_path / "seed1",
                            progress=False)
    assert not torch.equal(whole.params, other_seed.params)


@pytest.mark.parametrize("overrides, message", [
    (["compression.name=qsgd", "algorithm.name=mifa"], "compression.name=qsgd does not apply to mifa"),
    (["compression.levels=4"], "compression.levels only applies to compression.name=qsgd"),
    (["compression.name=top_k", "compression.bits=8"], "compression.bits only applies to compression.name=affine or"),
    (["compression.name=top_k", "compression.kept=5", "compression.ratio=0.1"], "both give a sparsifier's k"),
    (["compression.per_tensor=true"], "compression.per_tensor only applies with a compression.name other than"),
    (["compression.name=qsgd", "compression.levels=40000"], "compression.levels"),
])
def test_bad_compression_settings_are_one_line(overrides, message):
    import rayfed
    with pytest.raises(rayfed.ConfigError, match=message):
        rayfed.load_config(None, overrides)
