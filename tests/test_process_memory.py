"""Proportional set size: read from the kernel, summed over a run's processes (Ray's daemons named),
the peak of the samples in summary.json, null where there is no /proc; and the measurement that
the dataset is on a node once, read by every worker without a copy."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import rayfed
from rayfed.engine import process_memory
from rayfed.engine.process_memory import PeakPss, pss
from tests.test_engine_equivalence import ON_RAY

MIB = 2**20
TINY = ["data.num_clients=20", "train.clients_per_round=5", "train.rounds=3"]
LOCAL = [*TINY, "engine.backend=local"]
RAY = [*TINY, *ON_RAY, "engine.num_workers=2"]


def test_a_page_two_processes_map_counts_half_in_each():
    """128 MiB of shared memory read by one process, then also by a second: the first's PSS drops by
    half of it, and the second's holds the other half. Both are bare interpreters rather than this
    test's process: its shared libraries (torch's among them) gain and lose sharers as other tests'
    processes come and go, which moved its PSS by 3.4 MiB between two readings on CI."""
    size = 128 * MIB
    path = f"/dev/shm/rayfed-pss-test-{os.getpid()}"
    # Each maps the memory and reads every page when told, answering once it has.
    reader = ("import mmap, os, sys; m = mmap.mmap(os.open(sys.argv[1], os.O_RDONLY), 0, prot=mmap.PROT_READ); "
              "print(flush=True); sys.stdin.readline(); sum(m[i] for i in range(0, len(m), mmap.PAGESIZE)); "
              "print(flush=True); sys.stdin.read()")
    children = []

    def read_all(child):
        child.stdin.write("read\n")
        child.stdin.flush()
        child.stdout.readline()

    try:
        with open(path, "wb") as file:
            file.write(b"\1" * size)
        for _ in range(2):
            children.append(subprocess.Popen([sys.executable, "-c", reader, path], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True))
            children[-1].stdout.readline()
        first, second = children
        read_all(first)
        alone = pss(first.pid)
        read_all(second)
        shared, second_pss = pss(first.pid), pss(second.pid)
    finally:
        for child in children:
            child.stdin.close()
            child.wait()
        os.unlink(path)
    assert alone - shared == pytest.approx(size / 2, abs=2 * MIB)
    assert second_pss > size / 2


def test_pss_of_a_process_that_is_not_there_is_none():
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    assert pss(process.pid) is None
    assert pss(os.getpid()) > 0


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_peak_keeps_the_largest_sum_with_its_parts_and_samples_cost_at_most_a_fiftieth(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(process_memory.time, "perf_counter", clock)
    samples = iter([{"driver": 5, "server": 1}, None, {"driver": 3, "server": 4}, {"driver": 2, "server": 2},
                    {"server": 1}])
    taken = []

    def measure():
        taken.append(clock.now)
        clock.now += 1.0        # a sample that takes a second
        return next(samples)

    peak = PeakPss(measure)
    for round_end in (0.0, 10.0, 51.0, 52.0, 103.0, 200.0):
        clock.now = max(clock.now, round_end)
        peak.at_round_end()
    peak.sample()               # the run's end always samples
    assert taken == [0.0, 51.0, 103.0, 200.0, 201.0]
    assert (peak.bytes, peak.by_process) == (7, {"driver": 3, "server": 4})


@pytest.mark.parametrize("engine", [LOCAL, pytest.param(RAY, marks=pytest.mark.slow)], ids=["local", "ray"])
def test_a_run_without_proc_reports_null_pss_and_its_rss(tmp_path, monkeypatch, request, engine):
    """As on macOS: no /proc on the driver's machine."""
    if engine is RAY:
        request.getfixturevalue("ray_cluster")
    monkeypatch.setattr(process_memory, "PROC", tmp_path / "no-proc")
    summary = rayfed.run(rayfed.load_config(None, engine), run_dir=tmp_path / "run", progress=False).summary
    assert (summary["peak_pss_bytes"], summary["pss_by_process"]) == (None, None)
    assert summary["peak_rss_bytes"] > MIB
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (written["peak_pss_bytes"], written["pss_by_process"]) == (None, None)


def test_the_local_engine_reports_the_driver_alone(tmp_path):
    summary = rayfed.run(rayfed.load_config(None, LOCAL), run_dir=tmp_path / "run", progress=False).summary
    assert list(summary["pss_by_process"]) == ["driver"]
    assert summary["peak_pss_bytes"] == summary["pss_by_process"]["driver"]
    assert 10 * MIB < summary["peak_pss_bytes"] <= summary["peak_rss_bytes"]


@pytest.mark.slow
def test_the_ray_engine_names_the_run_processes_and_ray_daemons(tmp_path, ray_cluster):
    summary = rayfed.run(rayfed.load_config(None, RAY), run_dir=tmp_path / "run", progress=False).summary
    parts = summary["pss_by_process"]
    run_processes = {"driver", "server", "worker 0", "worker 1"}
    assert run_processes | {"gcs_server", "raylet", "dashboard_agent", "runtime_env_agent"} <= set(parts)
    assert min(parts.values()) > 0 and sum(parts.values()) == summary["peak_pss_bytes"]
    # Each process's PSS is at most its RSS, at most its peak RSS.
    assert sum(parts[name] for name in run_processes) <= summary["peak_rss_bytes"]


# In a fresh Ray (the session's store has held other tests' objects): a run on a small dataset as the
# baseline, then one on a large dataset on the same actors (engine.reuse_actors), so that the difference is the
# data's; prints the dataset's bytes and each run's PSS by process. No warm-up run before the baseline: a second
# small run's PSS was measured within 16 MiB of the first's; the driver stayed 93-129 MiB under its bound (125 MiB
# with the actors reused).
ZERO_COPY_RUNS = textwrap.dedent("""
    import json, sys, tempfile
    import ray, rayfed
    from rayfed.api import load_data

    def config(num_clients):
        return rayfed.load_config(None, [f"data.num_clients={num_clients}", "data.synthetic_max_samples=64",
                                         f"train.clients_per_round={min(num_clients, 300)}", "train.rounds=2",
                                         "engine.backend=ray", "engine.reuse_actors=true", "engine.num_workers=3"])

    dataset, _ = load_data(config(int(sys.argv[1])))
    data_bytes = sum(array.nbytes for array in (dataset.train_x, dataset.train_y, dataset.test_x, dataset.test_y))
    del dataset
    ray.init(address="local", num_cpus=4, num_gpus=0, include_dashboard=False, log_to_driver=False)
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, num_clients in (("baseline", 100), ("data", int(sys.argv[1]))):
            summary = rayfed.run(config(num_clients), run_dir=f"{scratch}/{name}", progress=False).summary
            runs[name] = summary["pss_by_process"]
    print(json.dumps({"data_bytes": data_bytes, **runs}))
""")


@pytest.mark.slow
def test_three_workers_on_a_node_share_one_copy_of_the_dataset():
    """293 MiB of synthetic data (20,000 clients) against 1.5 MiB (100 clients): a worker that copied
    the data would add its bytes to the workers' PSS once each (3x; measured 3.4x with np.array in
    attach), a driver that kept its own copy beside the object store's would add them to its PSS
    twice (2x; measured 1.9x); one shared copy adds them once in all (measured 1.1-1.2x in the
    driver, which wrote the store's pages, and 0.05-0.1x in the workers, which read their clients')."""
    completed = subprocess.run([sys.executable, "-c", ZERO_COPY_RUNS, "20000"], capture_output=True, text=True,
                               timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    runs = json.loads(completed.stdout.strip().splitlines()[-1])
    baseline, data, data_bytes = runs["baseline"], runs["data"], runs["data_bytes"]
    assert data_bytes > 250 * MIB

    def workers(parts):
        return sum(size for name, size in parts.items() if name.startswith("worker "))

    assert sorted(name for name in data if name.startswith("worker ")) == ["worker 0", "worker 1", "worker 2"]
    assert workers(data) - workers(baseline) < 1.5 * data_bytes
    assert data["driver"] - baseline["driver"] < 1.5 * data_bytes
    # The data is there once, and counted: the object store's pages are in the processes' PSS.
    assert sum(data.values()) - sum(baseline.values()) > 0.75 * data_bytes
