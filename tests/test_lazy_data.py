"""Clients made on demand (rayfed.data.lazy): synthetic_lazy's clients are the same made alone or
all together, a run on them equals the eager run on the same clients built up front, local equals
ray, a plugin can write one, and N = 10^7 clients hold no array of the data's size."""
import pickle
import textwrap
import tracemalloc

import numpy as np
import pytest

import rayfed
from rayfed.api import load_data
from rayfed.data import Partition, load_dataset
from rayfed.data.lazy import SIZES_CSV_MAX_CLIENTS, TRAIN_LOSS_MAX_CLIENTS, ClientSizes, LazyDataset
from rayfed.data.synthetic_lazy import SyntheticClients, size_thresholds
from rayfed.data import synthetic_lazy
from rayfed.registry import DATASETS
from rayfed.selection.selectors import select
from rayfed.systems.availability import AllClients
from rayfed.systems.clients import make_client_systems
from tests.test_checkpoint import interrupted
from tests.test_engine_equivalence import ON_RAY, assert_same_run

LAZY = ["data.dataset=synthetic_lazy", "data.num_clients=40", "data.synthetic_max_samples=80", "model.name=logreg",
        "train.clients_per_round=8", "train.rounds=4", "train.local_steps=3", "train.batch_size=16",
        "train.eval_every=2", "algorithm.name=fedavg", "algorithm.lr_local=0.05"]


def run(tmp_path, overrides, name):
    return rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / name, progress=False)


@pytest.fixture
def materialised():
    """`synthetic_lazy_built`: synthetic_lazy's clients all built up front, as an eager dataset."""
    @rayfed.register_dataset("synthetic_lazy_built", input_shape=(60,), num_classes=10, default_model="logreg",
                             natural=True, num_samples=lambda data: data.num_clients * data.synthetic_max_samples)
    def built(data, seed):
        return synthetic_lazy._synthetic_lazy(data, seed).materialise()
    yield
    DATASETS.remove("synthetic_lazy_built")


def test_a_client_made_alone_is_the_client_of_the_full_build(monkeypatch):
    monkeypatch.setattr(synthetic_lazy, "SIZE_CHUNK", 7)       # sizes() then crosses chunk boundaries
    source = SyntheticClients(seed=5, num_clients=50, alpha=1.0, beta=1.0, max_samples=200)
    full = LazyDataset("synthetic_lazy", source, np.empty((0, 60)), np.empty(0), 10, (60,)).materialise()
    sizes = source.sizes()
    assert sizes.dtype == np.int32 and np.array_equal(full.natural_partition.sizes, sizes)
    for client_id in (49, 0, 23):       # each from a fresh source, in another order than the build's
        alone = SyntheticClients(seed=5, num_clients=50, alpha=1.0, beta=1.0, max_samples=200)
        x, y = alone.client(client_id)
        rows = full.natural_partition.client(client_id)
        assert np.array_equal(x, full.train_x[rows]) and np.array_equal(y, full.train_y[rows])
        assert len(y) == sizes[client_id] == int(0.9 * alone.total_sizes(np.array([client_id]))[0])
        assert x.dtype == np.float32 and y.dtype == np.int64
    other_seed = SyntheticClients(seed=6, num_clients=50, alpha=1.0, beta=1.0, max_samples=200)
    assert not np.array_equal(other_seed.client(0)[0][:5], source.client(0)[0][:5])


def test_the_test_set_is_the_last_tenth_of_the_drawn_test_clients():
    dataset = load_dataset("synthetic_lazy", seed=3, num_clients=500, synthetic_test_clients=20)
    source = dataset.source
    chosen = source.test_clients(20)
    assert len(chosen) == 20 and np.all(np.diff(chosen) > 0)
    rows = [source.samples(int(client))[0][int(source.sizes()[client]):] for client in chosen]
    assert np.array_equal(dataset.test_x, np.concatenate(rows))
    everyone = load_dataset("synthetic_lazy", seed=3, num_clients=15, synthetic_test_clients=20)
    assert np.array_equal(everyone.source.test_clients(20), np.arange(15))


def test_sizes_follow_fedprox_capped_lognormal():
    """floor(lognormal(4, 2)) + 50 capped: the exact quantiles against numpy's own draws."""
    max_samples = 400
    lazy = SyntheticClients(0, 200_000, 1.0, 1.0, max_samples).total_sizes(np.arange(200_000))
    drawn = np.minimum(np.random.default_rng(1).lognormal(4, 2, 400_000).astype(np.int64) + 50, max_samples)
    grid = np.arange(50, max_samples + 1)
    lazy_cdf = np.searchsorted(np.sort(lazy), grid, side="right") / len(lazy)
    drawn_cdf = np.searchsorted(np.sort(drawn), grid, side="right") / len(drawn)
    assert np.abs(lazy_cdf - drawn_cdf).max() < 0.006          # Kolmogorov-Smirnov distance
    assert lazy.min() == 50 and lazy.max() == max_samples
    assert len(size_thresholds(max_samples)) == max_samples - 50


def test_an_on_demand_run_equals_the_eager_run_of_the_same_clients(tmp_path, materialised):
    for extra in ([], ["engine.vectorize=true"], ["algorithm.name=scaffold", "train.eval_train_loss=true"]):
        on_demand = run(tmp_path, LAZY + extra + ["engine.backend=local"], f"lazy{len(extra)}")
        built = run(tmp_path, LAZY + extra + ["data.dataset=synthetic_lazy_built", "engine.backend=local"],
                    f"built{len(extra)}")
        assert_same_run(on_demand, built)
    assert on_demand.history[-1]["global_train_loss"] > 0
    assert (tmp_path / "lazy0" / "partition.csv").read_text().splitlines()[:2] == [
        "client_id,num_samples", f"0,{load_data(rayfed.load_config(None, LAZY))[1].sizes[0]}"]


def test_an_on_demand_run_with_client_state_and_a_warm_up_resumes_bitwise(tmp_path, monkeypatch):
    """SCAFFOLD's states and CACS's warm-up (every client's full gradient) on clients made on demand."""
    overrides = LAZY + ["engine.backend=local", "algorithm.name=scaffold", "selection.selector=cacs",
                        "selection.cacs_warmup_rounds=1", "selection.cacs_clusters=4", "train.rounds=6",
                        "train.checkpoint_every=2"]
    whole = run(tmp_path, overrides, "whole")
    assert whole.summary["selection_warmup"]["client_rounds"] == 40
    resumed = rayfed.resume(interrupted(tmp_path, overrides, monkeypatch, fail_at_round=5), progress=False)
    assert_same_run(whole, resumed)


@pytest.fixture
def mapped(tmp_path):
    """`synthetic_lazy_mapped`: synthetic_lazy's clients saved as .npy files and read back through
    memory maps, every other client's rows listed in reverse (index lists, not ranges)."""
    from rayfed.data import mapped as mapped_files

    @rayfed.register_dataset("synthetic_lazy_mapped", input_shape=(60,), num_classes=10, default_model="logreg",
                             natural=True, lazy=True, num_samples=lambda data: data.num_clients * 80)
    def load(data, seed):
        built = synthetic_lazy._synthetic_lazy(data, seed).materialise()
        rows = [built.natural_partition.client(k) for k in range(data.num_clients)]
        rows = Partition.from_lists([r[::-1] if k % 2 else r for k, r in enumerate(rows)])
        source = mapped_files.save(tmp_path / "arrays", built.train_x, built.train_y, rows)
        return LazyDataset("synthetic_lazy_mapped", source, built.test_x, built.test_y, 10, (60,))
    yield
    DATASETS.remove("synthetic_lazy_mapped")


def test_clients_read_from_memory_mapped_files_by_index_lists(tmp_path, materialised, mapped):
    """The same clients as the eager build, each client's rows in its own order."""
    config = rayfed.load_config(None, LAZY + ["data.dataset=synthetic_lazy_mapped"])
    dataset, partition = load_data(config)
    built, built_partition = load_data(rayfed.load_config(None, LAZY + ["data.dataset=synthetic_lazy_built"]))
    for client_id in (0, 1, 39):
        x, y = dataset.source.client(client_id)
        rows = built_partition.client(client_id)[::-1 if client_id % 2 else 1]
        assert np.array_equal(x, built.train_x[rows]) and np.array_equal(y, built.train_y[rows])
    assert np.array_equal(partition.sizes, built_partition.sizes)
    assert len(pickle.dumps(dataset.source)) < built.train_x.nbytes / 20      # paths and index lists, not rows
    result = run(tmp_path, LAZY + ["data.dataset=synthetic_lazy_mapped", "engine.backend=local"], "mapped")
    assert len(result.history) == 4 and result.history[-1]["num_participants"] == 8


@pytest.mark.slow
def test_local_and_ray_are_bitwise_identical_on_synthetic_lazy(tmp_path, ray_cluster):
    local = run(tmp_path, LAZY + ["engine.backend=local"], "local")
    on_ray = run(tmp_path, LAZY + [*ON_RAY, "engine.num_workers=2"], "ray")
    assert_same_run(local, on_ray)
    # A worker restarted by Ray is attached to the source again and makes its clients as before.
    killed = run(tmp_path, LAZY + [*ON_RAY, "engine.num_workers=2", "engine.fault_injection=['kill:1:2']",
                                   "train.checkpoint_every=1"], "killed").history
    assert killed[1]["failed_workers"] == {"1": "died"} and killed[1]["num_lost"] > 0
    assert [m["num_participants"] for m in killed[2:]] == [8, 8]


def test_ten_million_clients_hold_their_sizes_and_nothing_the_size_of_the_data(tmp_path):
    """N = 10^7, S = 100, two rounds: what numpy holds at its peak is the sizes (int32, 40 MB)
    and chunk-sized temporaries; eagerly the clients' samples alone would be 10^7 x 57 x 60 floats."""
    overrides = ["data.dataset=synthetic_lazy", "data.num_clients=10000000", "data.synthetic_max_samples=64",
                 "model.name=logreg", "train.clients_per_round=100", "train.rounds=2", "train.eval_every=2",
                 "train.local_steps=5", "train.batch_size=32", "algorithm.name=fedavg", "engine.backend=local"]
    config = rayfed.load_config(None, overrides)
    tracemalloc.start()
    try:
        result = rayfed.run(config, run_dir=tmp_path / "n1e7", progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 10_000_000 + 8e6, peak          # int32 sizes, and at most 8 MB besides
    assert len(result.history) == 2 and result.history[0]["num_participants"] == 100
    assert not (tmp_path / "n1e7" / "partition.csv").exists()      # beyond SIZES_CSV_MAX_CLIENTS
    assert 10_000_000 > SIZES_CSV_MAX_CLIENTS
    systems = make_client_systems(config)
    assert isinstance(systems.speeds.step_time_s, float) and isinstance(systems.speeds.upload_bps, float)


def test_train_loss_over_every_client_is_refused_beyond_the_cap():
    with pytest.raises(rayfed.ConfigError) as refused:
        rayfed.load_config(None, ["data.dataset=synthetic_lazy", f"data.num_clients={TRAIN_LOSS_MAX_CLIENTS + 1}",
                                  "train.eval_train_loss=true"])
    assert str(refused.value) == (
        "train.eval_train_loss evaluates every client's training samples, which data.dataset=synthetic_lazy makes on "
        f"demand; with data.num_clients={TRAIN_LOSS_MAX_CLIENTS + 1} (more than {TRAIN_LOSS_MAX_CLIENTS}) set "
        "train.eval_train_loss=false")
    with pytest.raises(rayfed.ConfigError, match="data.partition=iid does not apply to data.dataset=synthetic_lazy"):
        rayfed.load_config(None, ["data.dataset=synthetic_lazy", "data.partition=iid"])


@pytest.mark.parametrize("selector", ["uniform", "ucs", "md"])
def test_every_client_online_selects_as_the_array_of_all_ids_does(selector):
    sizes = np.random.default_rng(0).integers(50, 60, 5000)
    draws = [select(selector, candidates, sizes, 30, np.random.default_rng(9))
             for candidates in (np.arange(5000), AllClients(5000))]
    assert np.array_equal(draws[0].clients, draws[1].clients) and draws[1].clients.dtype == np.int64
    assert (draws[0].weights is None and draws[1].weights is None) or np.array_equal(draws[0].weights,
                                                                                     draws[1].weights)
    everyone = AllClients(5)
    assert np.array_equal(everyone[np.array([4, 0, -1])], [4, 0, 4])
    assert np.array_equal(everyone[np.array([True, False, True, False, False])], [0, 2])
    assert np.array_equal(np.asarray(everyone), np.arange(5)) and np.array_equal(everyone[1:3], [1, 2])
    with pytest.raises(IndexError, match="client positions outside 0 .. 4"):
        everyone[np.array([5])]


PLUGIN = textwrap.dedent('''
    import numpy as np
    import rayfed
    from rayfed.data.lazy import LazyDataset


    class Stripes:
        """Client k: 8 + k % 5 samples of a 4-feature class pattern plus noise from its own stream."""
        def __init__(self, seed, num_clients):
            self.seed, self.num_clients = seed, num_clients

        def sizes(self):
            return 8 + np.arange(self.num_clients, dtype=np.int32) % 5

        def client(self, k):
            rng = np.random.default_rng([self.seed, k])
            labels = rng.integers(0, 4, 8 + k % 5)
            return (np.eye(4, dtype=np.float32)[labels] + rng.normal(0, 0.3, (len(labels), 4)).astype(np.float32),
                    labels.astype(np.int64))


    @rayfed.register_dataset("my_lazy_stripes", input_shape=(4,), num_classes=4, default_model="logreg",
                             natural=True, lazy=True, num_samples=lambda data: data.num_clients * 12,
                             resident_samples=64)
    def my_lazy_stripes(data, seed):
        source = Stripes(seed, data.num_clients)
        test = [source.client(k) for k in range(5)]
        return LazyDataset("my_lazy_stripes", source, np.concatenate([x for x, _ in test]),
                           np.concatenate([y for _, y in test]), 4, (4,))


    @rayfed.register_dataset("my_lazy_wrong", input_shape=(4,), num_classes=4, default_model="logreg",
                             natural=True, lazy=True, num_samples=100)
    def my_lazy_wrong(data, seed):
        x, y = np.zeros((10, 4), np.float32), np.zeros(10, np.int64)
        return rayfed.Dataset("my_lazy_wrong", x, y, x, y, 4, (4,))
''')
PLUGIN_RUN = ["data.dataset=my_lazy_stripes", "data.num_clients=30", "train.clients_per_round=6", "train.rounds=3",
              "train.batch_size=4", "train.local_steps=5", "algorithm.name=fedavg", "algorithm.lr_local=0.5"]


@pytest.fixture
def lazy_plugin(tmp_path):
    from tests.test_plugins import forget_plugins
    path = tmp_path / "my_lazy.py"
    path.write_text(PLUGIN)
    yield f"plugins=[{path}]"
    forget_plugins()


def test_a_plugin_writes_an_on_demand_dataset(tmp_path, lazy_plugin):
    result = run(tmp_path, [lazy_plugin, *PLUGIN_RUN, "engine.backend=local"], "plugin")
    assert len(result.history) == 3 and result.summary["final_test_accuracy"] > 0.25
    config = rayfed.load_config(None, [lazy_plugin, *PLUGIN_RUN])
    dataset, partition = load_data(config)
    assert isinstance(partition, ClientSizes) and np.array_equal(partition.sizes, 8 + np.arange(30) % 5)
    with pytest.raises(rayfed.ConfigError, match="^the loader of data.dataset=my_lazy_wrong returned a Dataset, not "
                                                 r"the LazyDataset its registration \(lazy=True\) declares$"):
        load_data(rayfed.load_config(None, [lazy_plugin, *PLUGIN_RUN, "data.dataset=my_lazy_wrong"]))
    with pytest.raises(rayfed.ConfigError, match="an on-demand dataset defines its own clients"):
        rayfed.register_dataset("my_lazy_iid", input_shape=(4,), num_classes=4, default_model="logreg",
                                num_samples=10, lazy=True)


@pytest.mark.slow
def test_a_plugin_on_demand_dataset_on_ray_is_bitwise_the_local_run(tmp_path, lazy_plugin, ray_cluster):
    local = run(tmp_path, [lazy_plugin, *PLUGIN_RUN, "engine.backend=local"], "local")
    on_ray = run(tmp_path, [lazy_plugin, *PLUGIN_RUN, *ON_RAY, "engine.num_workers=2"], "ray")
    assert_same_run(local, on_ray)
