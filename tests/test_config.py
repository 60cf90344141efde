"""Config loading: YAML and overrides, types, bounds, resolution, the checks against the model and
the machine, and the round trip through config.yaml."""
import copy
import math
import pickle
import re
import typing

import pytest

from rayfed.config import Config, all_keys, check_path
from rayfed.preflight import load_config, resolve
from rayfed.errors import ConfigError
from rayfed.registry import MODELS


def test_defaults_are_the_quick_start():
    config = load_config()
    assert (config.data.dataset, config.data.partition, config.model.name) == ("synthetic", "natural", "logreg")
    assert (config.algorithm.name, config.algorithm.beta1, config.algorithm.mu) == ("fedavgm", 0.9, None)
    assert (config.engine.backend, config.data.num_clients, config.train.clients_per_round) == ("ray", 100, 10)


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\ntrain:\n  rounds: 7\n  local_steps: 2\nalgorithm:\n  name: fedprox\n")
    config = load_config(path, ["train.rounds=9", "algorithm.mu=0.5", "model.hidden_sizes=[4, 5]"])
    assert (config.seed, config.train.rounds, config.train.local_steps) == (3, 9, 2)
    assert (config.algorithm.name, config.algorithm.mu, config.algorithm.beta1) == ("fedprox", 0.5, None)
    assert config.model.hidden_sizes == [4, 5]


def test_exponent_notation_without_a_dot_is_a_number():
    assert load_config(None, ["algorithm.lr_local=1e-3"]).algorithm.lr_local == 0.001
    with pytest.raises(ConfigError, match="algorithm.lr_local must be a number, got 'fast'"):
        load_config(None, ["algorithm.lr_local=fast"])


def test_integers_are_accepted_as_numbers_but_not_the_reverse():
    assert load_config(None, ["algorithm.lr_local=1"]).algorithm.lr_local == 1.0
    assert isinstance(load_config(None, ["algorithm.lr_local=1"]).algorithm.lr_local, float)
    with pytest.raises(ConfigError, match="train.rounds must be an integer"):
        load_config(None, ["train.rounds=true"])


def test_auto_choices_resolve_per_dataset():
    config = load_config(None, ["data.dataset=cifar10", "data.download=true"])
    assert (config.data.partition, config.model.name) == ("dirichlet", "lenet5")
    config = load_config(None, ["data.dataset=mnist", "data.download=true", "data.partition=shards"])
    assert (config.data.partition, config.model.name) == ("shards", "mlp")


def test_resolved_config_round_trips_through_yaml(tmp_path):
    config = load_config(None, ["algorithm.name=fedproxm", "seed=11", "engine.address=ray://head:10001"])
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert load_config(tmp_path / "config.yaml") == config
    assert resolve(config) == config


def test_local_backend_records_its_single_worker():
    assert load_config(None, ["engine.backend=local", "engine.num_workers=3"]).engine.num_workers == 1


def test_every_key_is_documented_in_the_schema():
    """The configuration reference is generated from these descriptions (docs/hooks/reference.py)."""
    from rayfed.registry import ALGORITHMS
    undocumented = []
    for key in all_keys():
        section, _, leaf = key.rpartition(".")
        if section == "algorithm":
            continue
        model = type(getattr(Config(), section)) if section else Config
        if not (model.model_fields[leaf].description or "").strip():
            undocumented.append(key)
    for name in ALGORITHMS.names():
        undocumented += [f"algorithm.{key} ({name})" for key, field in ALGORITHMS.get(name).target.Params.model_fields.items()
                         if not (field.description or "").strip()]
    assert not undocumented, f"keys without a description: {undocumented}"


def test_python_built_configs_are_validated_too():
    config = Config()
    config.train.clients_per_round = 500
    with pytest.raises(ConfigError, match="train.clients_per_round=500 exceeds"):
        resolve(config)


def test_new_engine_keys():
    config = load_config()
    assert (config.engine.server_max_restarts, config.engine.connect_timeout_s) == (3, 30.0)
    config = load_config(None, ["engine.server_max_restarts=0", "engine.connect_timeout_s=3600"])
    assert (config.engine.server_max_restarts, config.engine.connect_timeout_s) == (0, 3600.0)


def test_fault_injection_no_longer_needs_a_round_timeout_but_still_ray():
    config = load_config(None, ["engine.fault_injection=['kill:1:2', 'kill_server:3']"])
    assert config.engine.fault_injection == ["kill:1:2", "kill_server:3"]
    with pytest.raises(ConfigError, match="need engine.backend=ray"):
        load_config(None, ["engine.backend=local", "engine.fault_injection=['kill:0:2']"])


def _keys_of_type(kind):
    """Every key whose declared type is `kind` (Optional or not)."""
    keys = []
    for section, model in typing.get_type_hints(Config).items():
        if section in ("seed", "plugins"):
            continue
        for leaf, declared in typing.get_type_hints(model).items():
            if declared is kind or (typing.get_origin(declared) is typing.Union and kind in typing.get_args(declared)):
                keys.append(f"{section}.{leaf}")
    return keys


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "'nan'", "'inf'", "'-infinity'", "1e400"])
@pytest.mark.parametrize("key", _keys_of_type(float))
def test_every_number_is_finite(key, value):
    with pytest.raises(ConfigError, match=f"^{re.escape(key)}=-?inf must be a finite number$|^{re.escape(key)}=nan "):
        load_config(None, [f"{key}={value}"])


@pytest.mark.parametrize("key", ["seed", *_keys_of_type(int)])
def test_every_count_is_bounded(key):
    with pytest.raises(ConfigError, match=f"^{re.escape(key)}=1{'0' * 30} must be .*at most"):
        load_config(None, [f"{key}=1{'0' * 30}"])


def test_hidden_widths_and_layers_are_bounded():
    with pytest.raises(ConfigError, match=r"^model.hidden_sizes\[1\]=1000000001 must be > 0 and at most 1000000000$"):
        load_config(None, ["model.hidden_sizes=[5, 1000000001]"])
    with pytest.raises(ConfigError, match="^model.hidden_sizes may hold at most 64 entries$"):
        load_config(None, [f"model.hidden_sizes={[1] * 65}"])


def test_bounds_are_inclusive_where_documented():
    config = load_config(None, ["engine.worker_cpus=1024", "engine.worker_max_restarts=1000", "algorithm.lr_local=1e6",
                                "engine.round_timeout_s=1e6", "seed=9223372036854775807"])
    assert (config.engine.worker_cpus, config.engine.worker_max_restarts) == (1024.0, 1000)
    with pytest.raises(ConfigError, match="must be >= 0 and at most 9223372036854775807"):
        load_config(None, ["seed=9223372036854775808"])


def test_negative_zero_is_read_as_zero_and_generates_synthetic_data():
    from rayfed.data import load_dataset
    config = load_config(None, ["data.synthetic_alpha=-0.0", "data.synthetic_beta=-0.0"])
    assert math.copysign(1.0, config.data.synthetic_alpha) == 1.0
    dataset = load_dataset("synthetic", num_clients=3, synthetic_alpha=config.data.synthetic_alpha,
                           synthetic_beta=config.data.synthetic_beta)
    assert len(dataset.train_y) > 0


def test_integers_do_not_pass_as_floats_or_booleans_as_integers():
    for override in ("train.rounds=2.0", "train.rounds=true", "engine.num_workers='2'", "seed=1e3"):
        with pytest.raises(ConfigError, match="must be an integer"):
            load_config(None, [override])
    assert load_config(None, ["algorithm.lr_local=1e0"]).algorithm.lr_local == 1.0


@pytest.mark.parametrize("value, problem", [
    ("a\0b", "contains a NUL byte"),
    ("x" * 256, "has a name of 256 bytes; a file or folder name may be at most 255"),
    ("/".join(["y" * 100] * 41), "is 4140 bytes long; a path may be at most 4096"),
    ("é" * 128, "has a name of 256 bytes"),
])
def test_check_path_refuses_what_no_file_system_takes(value, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)) as raised:
        check_path("--out", value)
    assert str(raised.value).startswith("--out=") and "\n" not in str(raised.value)


def test_check_path_accepts_long_but_legal_paths():
    check_path("--out", "/".join(["z" * 255] * 16))


@pytest.mark.parametrize("dataset, fitting", [
    ("synthetic", ["logreg", "mlp", "relu_mlp"]),
    ("mnist", ["logreg", "mlp", "relu_mlp", "lenet5", "cnn8", "convmixer", "mnist_cnn", "cifar_cnn3fc", "cifar_cnn_ref", "resnet20"]),
    ("fashion_mnist", ["logreg", "mlp", "relu_mlp", "lenet5", "cnn8", "convmixer", "mnist_cnn", "cifar_cnn3fc",
                       "cifar_cnn_ref", "resnet20"]),
    ("cifar10", ["logreg", "mlp", "relu_mlp", "lenet5", "vgg11", "cnn8", "convmixer", "mnist_cnn", "cifar_cnn3fc",
                 "cifar_cnn_ref", "resnet20"]),
    ("cifar100", ["logreg", "mlp", "relu_mlp", "lenet5", "vgg11", "cnn8", "convmixer", "mnist_cnn", "cifar_cnn3fc",
                  "cifar_cnn_ref", "resnet20"]),
    ("digits", ["logreg", "mlp", "relu_mlp", "cnn8", "convmixer", "resnet20"]),
    ("shakespeare", ["char_lstm"]),
])
def test_models_are_checked_against_the_dataset_shape(dataset, fitting):
    for model in MODELS.names():
        overrides = [f"data.dataset={dataset}", "data.download=true", f"model.name={model}"]
        if model in fitting:
            assert load_config(None, overrides).model.name == model
        else:
            with pytest.raises(ConfigError, match=f"model.name={model} does not fit data.dataset={dataset} "
                                                  rf".*; use one of: {', '.join(fitting)}$"):
                load_config(None, overrides)


def test_a_model_misfit_reads_the_same_on_either_engine():
    messages = set()
    for backend in ("local", "ray"):
        with pytest.raises(ConfigError) as raised:
            load_config(None, ["model.name=lenet5", f"engine.backend={backend}"])
        messages.add(str(raised.value))
    assert len(messages) == 1


@pytest.mark.parametrize("model, has_batchnorm", [("logreg", False), ("mlp", True), ("relu_mlp", False)])
def test_batchnorm_needs_batches_of_two(model, has_batchnorm):
    overrides = [f"model.name={model}", "train.batch_size=1"]
    if has_batchnorm:
        with pytest.raises(ConfigError, match="BatchNorm, which cannot train on batches of one"):
            load_config(None, overrides)
    else:
        assert load_config(None, overrides).train.batch_size == 1


def test_memory_estimate_counts_the_algorithms_state(monkeypatch):
    from rayfed.resources import estimate_memory, meta_model
    model = meta_model("mlp", "mnist", (200, 100))
    d = sum(parameter.numel() for parameter in model.parameters())
    base = ["data.dataset=mnist", "data.download=true", "data.num_clients=1000", "engine.backend=local"]
    fedavg = estimate_memory(load_config(None, base + ["algorithm.name=fedavg"]), model)
    mifa = estimate_memory(load_config(None, base + ["algorithm.name=mifa"]), model)
    gradma_s = estimate_memory(load_config(None, base + ["algorithm.name=gradma_s", "algorithm.memory_size=50"]), model)
    assert fedavg["data"] == 70_000 * (784 * 4 + 8) and fedavg["client states"] == 0
    assert mifa["client states"] == 1000 * d * 4
    assert gradma_s["server memory"] == 50 * d * 4 + 50 * 50 * 8
    cacs = estimate_memory(load_config(None, base + ["algorithm.name=fedmos", "selection.selector=cacs"]), model)
    assert cacs["cacs gradients"] == 1000 * d * (4 + 8) + 2 * 1000 ** 2 * 8 and "cacs gradients" not in fedavg


def test_memory_check_refuses_what_this_machine_cannot_hold(monkeypatch):
    monkeypatch.setattr("rayfed.resources.physical_memory_bytes", lambda: 10**9)
    with pytest.raises(ConfigError, match=r"^the run needs about 1\.1 GB \(data 1\.1 GB\), more than this machine's "
                                          r"1\.0 GB; lower data.num_clients or data.synthetic_max_samples$"):
        load_config(None, ["data.num_clients=2200", "train.clients_per_round=10"])
    assert load_config(None, ["data.num_clients=2000"]).data.num_clients == 2000


def test_shipped_configs_and_bench_workloads_pass_the_checks(tmp_path, monkeypatch):
    """Run configs load; sweep files (base + grid), run from the repository's root, have every grid point
    resolve. The datasets' files need not be here (nor downloadable: LEAF's Shakespeare is not)."""
    from pathlib import Path
    import yaml
    import rayfed.preflight
    from rayfed.bench.workloads import WORKLOADS, workload_config
    from rayfed.sweep.spec import read_sweep
    root = Path(__file__).parents[1]
    monkeypatch.chdir(root)
    monkeypatch.setattr(rayfed.preflight, "_check_dataset_files", lambda config: None)
    for path in sorted((root / "experiments").rglob("*.yaml")):
        if "grid" in yaml.safe_load(path.read_text()):
            assert read_sweep(str(path.relative_to(root)), [], tmp_path / "base.yaml").trials
        else:
            load_config(path)
    for name in WORKLOADS:
        workload_config(name, 3)


def test_configs_survive_copies_and_pickles():
    config = load_config(None, ["algorithm.name=gradma", "model.hidden_sizes=[8]"])
    assert copy.deepcopy(config) == config and pickle.loads(pickle.dumps(config)) == config
    changed = copy.deepcopy(config)
    changed.engine.num_workers = 1
    assert changed != config and config.engine.num_workers == 2


def test_what_a_key_naming_a_component_admits_is_read_from_its_registry_when_asked():
    """The config reference's admits column: a model registered after the schema was built is among them."""
    from rayfed.config import ModelConfig
    from rayfed.fields import allowed_values
    field = ModelConfig.model_fields["name"]
    declared = typing.Annotated[(field.annotation, *field.metadata)]
    before = allowed_values(declared)
    assert before == "one of: auto, " + ", ".join(MODELS.names()) and "resnet20" in before
    MODELS.register("my_admitted_model")(object)
    try:
        assert allowed_values(declared) == before + ", my_admitted_model"
    finally:
        MODELS.remove("my_admitted_model")
