"""The bench's plumbing: the plain loop trains exactly rayfed's model (so timing one against the
other compares like with like), and `rayfed bench` reports, or rejects bad input up front."""
import contextlib
import io
import json

import pytest
import torch

import rayfed
from rayfed.api import load_data
from rayfed.bench.plain_loop import PlainFedAvg
from rayfed.bench.runner import ENGINES, format_table, measure_engine
from rayfed.bench.study import ROW_KEYS
from rayfed.bench.workloads import workload_config
from rayfed.cli import main
from tests.test_engine_equivalence import ON_RAY

SMALL = ["data.num_clients=40", "train.clients_per_round=6"]


def plain_params(config):
    loop = PlainFedAvg(config, *load_data(config))
    for round in range(config.train.rounds):
        loop.run_round(round)
    buffers = torch.cat([b.reshape(-1) for b in loop.global_buffers]) if loop.global_buffers else torch.zeros(0)
    return loop.params(), buffers


@pytest.mark.parametrize("workload, engine", [("tiny", ["engine.backend=local"]),
                                              ("tiny", [*ON_RAY, "engine.num_workers=2"]),
                                              # BatchNorm statistics and dropout streams
                                              ("lenet", ["engine.backend=local", "train.local_steps=2"])])
def test_plain_loop_trains_bitwise_the_model_rayfed_trains(tmp_path, ray_cluster, workload, engine, cifar_lenet):
    if workload == "lenet":
        # LeNet-5 on small CIFAR-10 files rather than the workload's 60,000 random images, which cost their
        # making (twice) and the final evaluation's time, not a different path through the loop.
        engine = [*engine, *(entry for entry in cifar_lenet if entry.startswith(("data.dataset=", "data.root=")))]
    config = workload_config(workload, 3, [*SMALL, *engine])
    result = rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    params, buffers = plain_params(config)
    assert torch.equal(params, result.params)
    assert torch.equal(buffers, result.buffers)
    assert (buffers.numel() > 0) == (workload == "lenet")


@pytest.mark.slow
def test_ray_reused_measures_a_run_on_the_actors_a_first_run_kept(ray_cluster):
    from tests.test_actor_pool import ever
    rayfed.release_actors()
    config = workload_config("tiny", 5, SMALL)
    before = ever("RayClientWorker") | ever("RayServer")
    measured = measure_engine("tiny", 5, [*ENGINES["ray_reused"], *SMALL])
    # The first run started three actors (two workers and the server); the measured one started none.
    assert len(ever("RayClientWorker") | ever("RayServer")) == len(before) + 3
    assert torch.equal(measured["params"], plain_params(config)[0])
    rayfed.release_actors()


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One `rayfed bench` of the tiny workload on the local engine, for the tests of its report and of
    the command: its table as printed, and the JSON it wrote (bench()'s report). Each bench measures in
    two fresh processes that import rayfed and PyTorch."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["bench", "tiny", *SMALL, "--engines", "local", "--rounds", "6", "--json", str(out)]) == 0
    return printed.getvalue(), json.loads(out.read_text())


@pytest.mark.xdist_group("bench_run")
def test_bench_reports_ratios_phases_and_memory(bench_run):
    _, results = bench_run
    assert results["rounds"] == 6 and results["repeats"] == 1
    rows = results["workloads"]["tiny"]
    assert set(rows) >= {"plain", "local", "description"}
    local = rows["local"]
    assert local["max_abs_diff_vs_plain"] == 0.0
    assert local["vs_plain"] == pytest.approx(local["round_s"] / rows["plain"]["round_s"])
    assert set(local["phases_s"]) == {"sample", "broadcast", "train", "upload", "server_step", "eval", "other"}
    assert local["phases_s"]["train"] > 0 and local["peak_rss_bytes"] > 2**20
    # each round's time outside training and the step is at most the round's, so their medians are too
    assert 0 < local["fixed_cost_s"] <= local["round_s"]
    # PSS (sampled) at most peak RSS; one process each
    for row in (rows["plain"], local):
        assert 2**20 < row["peak_pss_bytes"] <= row["peak_rss_bytes"]
    assert list(local["pss_by_process"]) == ["driver"]
    # 6 of 40 clients per round, each downloading and uploading the 610-float model
    assert local["bytes_per_round"] == 6 * 2 * 610 * 4


def test_phases_are_disjoint_parts_of_each_round(tmp_path):
    """In the local engine the phases run one after another inside the round."""
    config = workload_config("tiny", 4, [*SMALL, "engine.backend=local"])
    history = rayfed.run(config, run_dir=tmp_path / "run", progress=False).history
    for previous, metrics in zip(history, history[1:]):
        phases = metrics["phase_s"]
        assert set(phases) == {"sample", "broadcast", "train", "upload", "server_step", "eval"}
        assert min(phases.values()) >= 0 and phases["train"] > 0
        assert sum(phases.values()) <= metrics["wall_time_s"] - previous["wall_time_s"]
    assert history[-1]["phase_s"]["eval"] > 0 and history[-2]["phase_s"]["eval"] < history[-1]["phase_s"]["eval"]


@pytest.mark.parametrize("arguments, message", [
    (["bench", "tinyy"], "unknown workload 'tinyy'; choose from tiny, lenet, huge_n, million, study"),
    (["bench", "study", "algorithm.name=mifa"], "algorithm.name cannot be overridden"),
    (["bench", "study", "--engines", "local,rya"], "unknown engine 'rya'"),
    (["bench", "tiny", "--engines", "local,rya"], "unknown engine 'rya'"),
    (["bench", "tiny", "--rounds", "3"], "--rounds=3 must be at least"),
    (["bench", "tiny", "train.roundz=3"], "train.roundz"),
    (["bench", "tiny", "algorithm.name=mifa"], "algorithm.name cannot be overridden"),
    (["bench", "tiny", "--json", "/nonexistent/dir/out.json"], "does not exist"),
])
def test_bad_bench_arguments_fail_with_one_line_before_any_work(tmp_path, capsys, arguments, message):
    assert main(arguments) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0]


@pytest.mark.xdist_group("bench_run")
def test_bench_writes_its_table_as_json(bench_run):
    printed, results = bench_run
    header, = [line for line in printed.splitlines() if "vs plain" in line]
    assert "RSS MiB  PSS MiB" in header and "fixed ms  MiB/rnd" in header
    local_line, = [line for line in printed.splitlines() if line.startswith("local ")]
    assert local_line.split()[-3] == f"{results['workloads']['tiny']['local']['fixed_cost_s'] * 1e3:.2f}"
    local = results["workloads"]["tiny"]["local"]
    assert local["rounds_per_s"] > 0 and local["peak_pss_bytes"] > 0


def test_the_table_shows_no_pss_where_the_kernel_does_not_tell():
    row = {"round_s": 0.1, "rounds_per_s": 10.0, "vs_plain": 1.0, "startup_s": 1.0, "data_s": 0.5,
           "peak_rss_bytes": 100 * 2**20, "max_abs_diff_vs_plain": 0.0}
    lines = format_table("tiny", {"plain": {**row, "peak_pss_bytes": None},
                                  "local": {**row, "peak_pss_bytes": 60 * 2**20}}).splitlines()
    assert lines[2].split()[6:8] == ["100", "-"] and lines[3].split()[6:8] == ["100", "60"]


@pytest.mark.slow
def test_bench_study_times_a_sweep_s_start_up_apart_from_its_runs(tmp_path, capsys):
    """`rayfed bench study`: a small sweep through rayfed sweep's machinery, its time split into Ray's
    start, the trial processes' start, the start-up per trial and the runs; vectorised, its 8 trials
    (2 learning rates x 4 seeds) run as one pack."""
    out = tmp_path / "bench.json"
    assert main(["bench", "study", "--engines", "local_vec", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["workloads"]["study"]["local_vec"]
    assert set(row) == set(ROW_KEYS)
    assert (row["trials"], row["packs"], row["rounds"]) == (8, 1, 2)
    # Trials reuse the processes Tune started: no more of them than trials run at once.
    assert 1 <= row["processes"] <= row["slots"] <= 8
    assert row["run_per_trial_s"] == pytest.approx(row["run_s"] / 8)
    assert 0 < row["ray_start_s"] + row["processes_start_s"] + row["run_s"] / row["slots"] < row["wall_s"]
    printed = capsys.readouterr().out
    assert printed.startswith("study: rayfed sweep of 8 trials") and "\nlocal_vec " in printed
