"""Proportional set size: read from the kernel, summed over a run's processes (Ray's daemons named),
the peak of the samples in summary.json, null where there is no /proc."""
import json
import mmap
import os
import subprocess
import sys

import pytest

import rayfed
from rayfed.engine import process_memory
from rayfed.engine.process_memory import PeakPss, pss

MIB = 2**20
TINY = ["data.num_clients=20", "train.clients_per_round=5", "train.rounds=3"]
LOCAL = [*TINY, "engine.backend=local"]
RAY = [*TINY, "engine.backend=ray", "engine.num_workers=2"]


def test_a_page_two_processes_map_counts_half_in_each():
    """64 MiB of shared memory touched by this process, then also by a child: this process's PSS
    drops by half of it, and the child's holds the other half."""
    size = 64 * MIB
    path = f"/dev/shm/rayfed-pss-test-{os.getpid()}"
    child = None
    try:
        with open(path, "w+b") as file:
            file.truncate(size)
            shared = mmap.mmap(file.fileno(), size)
        shared.write(b"\1" * size)
        # The child maps the memory but reads it only when told, once it shares this process's libraries.
        reader = ("import mmap, os, sys; m = mmap.mmap(os.open(sys.argv[1], os.O_RDONLY), 0, prot=mmap.PROT_READ); "
                  "print(flush=True); sys.stdin.readline(); sum(m[i] for i in range(0, len(m), mmap.PAGESIZE)); "
                  "print(flush=True); sys.stdin.read()")
        child = subprocess.Popen([sys.executable, "-c", reader, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        child.stdout.readline()
        alone = pss(os.getpid())
        child.stdin.write("read\n")
        child.stdin.flush()
        child.stdout.readline()     # it has read every page
        shared_with_child, child_pss = pss(os.getpid()), pss(child.pid)
    finally:
        if child is not None:
            child.stdin.close()
            child.wait()
        os.unlink(path)
    shared.close()
    assert alone - shared_with_child == pytest.approx(size / 2, abs=2 * MIB)
    assert child_pss > size / 2


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
