"""`rayfed bench`: checks its arguments before any measurement, prints the tables, writes the JSON."""
from __future__ import annotations

import json
from pathlib import Path

from rayfed.bench.runner import ENGINES, WARM_UP_ROUNDS, bench
from rayfed.bench.study import STUDY, study_config
from rayfed.bench.workloads import WORKLOADS, workload_config
from rayfed.errors import ConfigError


def bench_command(items: list[str], engines: str, rounds: int, repeats: int, json_path: str) -> int:
    workloads = [item for item in items if "=" not in item] or list(WORKLOADS)
    overrides = [item for item in items if "=" in item]
    engine_names = [name for name in engines.split(",") if name]
    for name in engine_names:
        if name not in ENGINES:
            raise ConfigError(f"--engines: unknown engine {name!r}; choose from {', '.join(ENGINES)}")
    if rounds < WARM_UP_ROUNDS + 2:
        raise ConfigError(f"--rounds={rounds} must be at least {WARM_UP_ROUNDS + 2} "
                          f"({WARM_UP_ROUNDS} warm-up rounds, one measured, one evaluating)")
    if repeats < 1:
        raise ConfigError(f"--repeats={repeats} must be at least 1")
    for workload in workloads:
        if workload not in (*WORKLOADS, STUDY):
            raise ConfigError(f"unknown workload {workload!r}; choose from {', '.join([*WORKLOADS, STUDY])}")
        for name in engine_names:
            if workload == STUDY:
                study_config([*ENGINES[name], *overrides])
            else:
                workload_config(workload, rounds, [*ENGINES[name], *overrides])
    out = Path(json_path)
    if out.exists() and not out.is_file():
        raise ConfigError(f"--json {out} exists and is not a file")
    if not out.parent.is_dir():
        raise ConfigError(f"--json {out}: directory {out.parent} does not exist")
    results = bench(workloads, engine_names, rounds, repeats, overrides, report=lambda table: print(table + "\n"))
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")
    return 0
