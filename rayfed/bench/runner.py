"""Runs workloads under rayfed's engines and under the plain loop, each measurement in a fresh
process (so each peak-memory figure is its own), and reduces them to one table.

Round times are medians over the rounds after a warm-up, leaving out the last round (the only
one that evaluates). Repeats alternate plain loop and engines so that machine noise hits all alike.
"""
from __future__ import annotations

import multiprocessing
import platform
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from rayfed.bench.study import STUDY, format_study, measure_study, reduce_study
from rayfed.bench.workloads import DESCRIPTIONS, workload_config
from rayfed.engine.process_memory import PeakPss, own_pss, peak_rss

WARM_UP_ROUNDS = 3
PHASES = ("sample", "broadcast", "train", "upload", "server_step", "eval")
# What each engine name means as config overrides.
ENGINES = {
    "local": ["engine.backend=local"],
    "ray": ["engine.backend=ray", "engine.num_workers=2"],
    "ray_driver": ["engine.backend=ray", "engine.num_workers=2", "engine.server=driver"],
    # `ray` measured on the actors a first run in the same process kept (engine.reuse_actors).
    "ray_reused": ["engine.backend=ray", "engine.num_workers=2", "engine.reuse_actors=true"],
    "local_vec": ["engine.backend=local", "engine.vectorize=true"],
    "ray_vec": ["engine.backend=ray", "engine.num_workers=2", "engine.vectorize=true"],
}


def measure_plain(workload: str, rounds: int, overrides: list[str]) -> dict:
    """The plain loop on `workload`; runs in its own process."""
    from rayfed.api import load_data
    from rayfed.bench.plain_loop import PlainFedAvg
    started = time.perf_counter()
    config = workload_config(workload, rounds, overrides)
    dataset, partition = load_data(config)
    data_time_s = time.perf_counter() - started
    loop = PlainFedAvg(config, dataset, partition)
    startup_s = time.perf_counter() - started
    # Sampled as a rayfed run samples it; the memory's measurement is outside the timed rounds.
    memory = PeakPss(lambda: own_pss("plain"))
    round_s = []
    for round in range(rounds):
        round_s.append(loop.run_round(round))
        memory.at_round_end()
    memory.sample()
    # The same rounds as rayfed's medians, although the plain loop's last round does not evaluate.
    return {"round_s": _steady_median(round_s), "startup_s": startup_s, "data_s": data_time_s,
            "peak_rss_bytes": peak_rss()[1], "peak_pss_bytes": memory.bytes, "params": loop.params()}


def measure_engine(workload: str, rounds: int, overrides: list[str]) -> dict:
    """rayfed.run on `workload`; runs in its own process."""
    import rayfed
    config = workload_config(workload, rounds, overrides)
    with tempfile.TemporaryDirectory() as scratch:
        if config.engine.reuse_actors:
            _first_run(workload, overrides, Path(scratch) / "first")
        result = rayfed.run(config, run_dir=Path(scratch) / "run", progress=False)
    history, summary = result.history, result.summary
    walls = [history[0]["wall_time_s"]] + [b["wall_time_s"] - a["wall_time_s"] for a, b in zip(history, history[1:])]
    phases = {phase: _steady_median([m["phase_s"][phase] for m in history]) for phase in PHASES}
    # Evaluation runs once, in the last round, which the medians leave out: report it as measured there.
    phases["eval"] = history[-1]["phase_s"]["eval"]
    other = [wall - sum(m["phase_s"][p] for p in PHASES if p != "eval") for wall, m in zip(walls, history)]
    phases["other"] = _steady_median(other)
    # What the simulator adds to a round besides the maths: its time outside training and the server step.
    fixed = [wall - m["phase_s"]["train"] - m["phase_s"]["server_step"] for wall, m in zip(walls, history)]
    return {"round_s": _steady_median(walls), "fixed_cost_s": _steady_median(fixed),
            "startup_s": summary["startup_time_s"], "data_s": summary["data_time_s"],
            "peak_rss_bytes": summary["peak_rss_bytes"], "peak_pss_bytes": summary["peak_pss_bytes"],
            "pss_by_process": summary["pss_by_process"], "phases_s": phases,
            "bytes_per_round": statistics.mean(m["bytes_up"] + m["bytes_down"] for m in history),
            "vectorized": summary["vectorized"], "params": result.params.cpu()}


def _first_run(workload: str, overrides: list[str], run_dir: Path) -> None:
    """Starts Ray here as a run would start its private instance, so that it outlives the run, and plays one
    round of `workload`, whose actors the measured run then reuses."""
    import rayfed
    from rayfed.engine.ray import connect_ray
    first = workload_config(workload, 1, overrides)
    engine = first.engine
    connect_ray(engine.address, engine.num_workers * engine.worker_cpus, engine.connect_timeout_s)
    rayfed.run(first, run_dir=run_dir, progress=False)


def _steady_median(per_round: list[float]) -> float:
    """Median after the warm-up, leaving out the last (evaluating) round."""
    steady = per_round[WARM_UP_ROUNDS:-1]
    if not steady:
        raise ValueError(f"need more than {WARM_UP_ROUNDS + 1} rounds to measure")
    return statistics.median(steady)


def _in_fresh_process(function, *args) -> dict:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def bench(workloads: list[str], engines: list[str], rounds: int, repeats: int, overrides: list[str] = (),
          report=print) -> dict:
    """Measures every workload with the plain loop and each engine; returns the JSON report."""
    results = {"machine": {"platform": platform.platform(), "cpus": multiprocessing.cpu_count(),
                           "torch": torch.__version__, "cuda": torch.cuda.is_available()},
               "rounds": rounds, "repeats": repeats, "warm_up_rounds": WARM_UP_ROUNDS,
               # The workloads' descriptions are their defaults; these change them.
               "overrides": list(overrides), "engines": {engine: ENGINES[engine] for engine in engines},
               "workloads": {}}
    for workload in workloads:
        if workload == STUDY:
            study = {engine: reduce_study([_in_fresh_process(measure_study, [*ENGINES[engine], *overrides])
                                           for _ in range(repeats)]) for engine in engines}
            results["workloads"][STUDY] = {"description": DESCRIPTIONS[STUDY], **study}
            report(format_study(study))
            continue
        workload_config(workload, rounds, overrides)      # bad names or overrides fail before any work
        runs = {"plain": []} | {engine: [] for engine in engines}
        for _ in range(repeats):
            runs["plain"].append(_in_fresh_process(measure_plain, workload, rounds, list(overrides)))
            for engine in engines:
                runs[engine].append(_in_fresh_process(measure_engine, workload, rounds,
                                                      [*ENGINES[engine], *overrides]))
        table = _reduce(runs)
        results["workloads"][workload] = {"description": DESCRIPTIONS[workload], **table}
        report(format_table(workload, table))
    return results


def _reduce(runs: dict[str, list[dict]]) -> dict:
    plain_round_s = statistics.median(run["round_s"] for run in runs["plain"])
    reference = runs["plain"][0]["params"]
    table = {}
    for name, measured in runs.items():
        row = {key: statistics.median(run[key] for run in measured)
               for key in ("round_s", "startup_s", "data_s", "peak_rss_bytes")}
        # None without /proc (macOS)
        pss_values = [run["peak_pss_bytes"] for run in measured]
        row["peak_pss_bytes"] = None if None in pss_values else statistics.median(pss_values)
        row["rounds_per_s"] = 1.0 / row["round_s"]
        row["vs_plain"] = row["round_s"] / plain_round_s
        row["max_abs_diff_vs_plain"] = max(float((run["params"] - reference).abs().max()) for run in measured)
        if name != "plain":
            row["vectorized"] = all(run["vectorized"] for run in measured)
            row["phases_s"] = {phase: statistics.median(run["phases_s"][phase] for run in measured)
                               for phase in measured[0]["phases_s"]}
            row["fixed_cost_s"] = statistics.median(run["fixed_cost_s"] for run in measured)
            row["bytes_per_round"] = measured[0]["bytes_per_round"]
            row["pss_by_process"] = measured[0]["pss_by_process"]
        table[name] = row
    return table


def format_table(workload: str, table: dict) -> str:
    phases = (*PHASES, "other")
    header = (f"{'':<10}{'s/round':>9}{'rounds/s':>9}{'vs plain':>9}{'startup':>9}{'(data)':>8}{'RSS MiB':>9}"
              f"{'PSS MiB':>9}" + "".join(f"{phase[:8]:>9}" for phase in phases)
              + f"{'fixed ms':>9}{'MiB/rnd':>9}{'max|dw|':>9}")
    lines = [f"{workload}: {DESCRIPTIONS[workload]}", header]
    for name, row in table.items():
        line = (f"{name:<10}{row['round_s']:>9.4f}{row['rounds_per_s']:>9.1f}{row['vs_plain']:>8.2f}x"
                f"{row['startup_s']:>9.2f}{row['data_s']:>8.2f}{row['peak_rss_bytes'] / 2**20:>9.0f}"
                f"{'-' if row['peak_pss_bytes'] is None else format(row['peak_pss_bytes'] / 2**20, '.0f'):>9}")
        if "phases_s" in row:
            line += "".join(f"{row['phases_s'][phase]:>9.4f}" for phase in phases)
            line += f"{row['fixed_cost_s'] * 1e3:>9.2f}{row['bytes_per_round'] / 2**20:>9.2f}"
        else:
            line += " " * 9 * (len(phases) + 2)
        lines.append(line + f"{row['max_abs_diff_vs_plain']:>9.1e}")
    for name, row in table.items():
        if name.endswith("_vec") and not row["vectorized"]:
            lines.append(f"{name}: the model or algorithm cannot be vectorised; it trained clients one after another")
    return "\n".join(lines)
