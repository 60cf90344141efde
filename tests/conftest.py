import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts Ray actors or whole runs in subprocesses (still runs in CI)")


@pytest.fixture(scope="session")
def ray_cluster():
    """One private Ray instance for the tests that use the ray engine (which joins it).
    Four CPUs so that three one-CPU workers fit on a two-core machine; no GPUs, so that the
    tests see the same cluster on a machine with one."""
    import ray
    ray.init(address="local", num_cpus=4, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
