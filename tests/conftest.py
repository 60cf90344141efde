import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    """One private Ray instance for the tests that use the ray engine (which joins it).
    Four CPUs so that three one-CPU workers fit on a two-core machine."""
    import ray
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
