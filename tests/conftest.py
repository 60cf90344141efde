import compileall
from pathlib import Path

import numpy as np
import pytest

import rayfed
from tests.dataset_files import write_cifar10


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts Ray actors or whole runs in subprocesses (still runs in CI)")
    if not hasattr(config, "workerinput"):
        # Each of the suite's hundreds of Ray actor processes imports rayfed; under PYTHONDONTWRITEBYTECODE
        # (set on CI) each would compile it from source again, 0.3-0.5 s of CPU a process.
        compileall.compile_dir(Path(rayfed.__file__).parent, quiet=1)


@pytest.fixture(scope="session")
def ray_cluster():
    """One private Ray instance for the tests that use the ray engine (which joins it).
    Four CPUs so that three one-CPU workers fit on a two-core machine; no GPUs, so that the
    tests see the same cluster on a machine with one."""
    import ray
    ray.init(address="local", num_cpus=4, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def cifar_lenet(tmp_path_factory):
    """LeNet-5 (BatchNorm and dropout) on small CIFAR-10 files: dropout masks must be reproducible too."""
    root = tmp_path_factory.mktemp("cifar")
    write_cifar10(root, np.random.default_rng(0), num_train=160, num_test=40)
    return ["data.dataset=cifar10", f"data.root={root}", "data.partition=iid", "data.num_clients=8",
            "train.clients_per_round=4", "train.rounds=2", "train.local_steps=2", "train.batch_size=16",
            "model.name=lenet5", "algorithm.name=fedproxm", "algorithm.lr_local=0.01"]
