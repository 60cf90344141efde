"""`rayfed report DIR... [--group KEY ...] [--select METRIC] [--target ACC] [--metric KEY,...]
[--x round|virtual_time_s|bytes] [--log-x] [--log-y] [--format png,pdf] [--out DIR]`."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from rayfed.errors import ConfigError
from rayfed.report.groups import check_group_keys, group_runs
from rayfed.report.plots import DEFAULT_METRICS, FORMATS, write_plots
from rayfed.report.runs import Run, Unusable, read_config, read_run
from rayfed.report.stats import group_stats, group_target
from rayfed.report.sweeps import plan
from rayfed.report.table import render_report


def report_from_args(args: argparse.Namespace) -> int:
    """`rayfed report` with the options of `rayfed.report.options.add_report_arguments`."""
    return report_command(args.dirs, args.group, args.target, args.x, args.out, select=args.select,
                          metrics=_names("--metric", args.metric), formats=_names("--format", args.format, FORMATS),
                          log_x=args.log_x, log_y=args.log_y)


def report_command(dirs: list[str], keys: list[str] | None = None, target: float | None = None, x: str = "round",
                   out: str | None = None, *, select: str | None = None, metrics=DEFAULT_METRICS,
                   formats=("png", "pdf"), log_x: bool = False, log_y: bool = False) -> int:
    """`keys` None: the default grouping of `rayfed.report.sweeps.plan`."""
    if target is not None and not (math.isfinite(target) and 0 <= target <= 1):
        raise ConfigError(f"--target is a test accuracy as a fraction in [0, 1], got {target}")
    chosen = plan(dirs, keys, select)
    runs, unusable, configs = _read_runs(chosen.paths)
    keys = [key for key in chosen.keys if key not in chosen.optional or any(key in config for config in configs)]
    if configs:     # where no config.yaml could be read, the report says so instead
        check_group_keys([key for key in keys if key not in chosen.optional], configs)
    _check_metrics(metrics, runs)
    groups = group_runs(runs, keys)
    stats = [group_stats(group, group_target(group, target)) for group in groups if not group.mismatches]
    text = render_report(keys, stats, groups, unusable, chosen.notes)
    out_dir = Path(out) if out is not None else Path(dirs[0]) if len(dirs) == 1 else Path("report")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        plots = write_plots(keys, stats, x, out_dir, metrics, formats, log_x, log_y) if stats else []
        images = {}     # one image per figure in report.md: PNG, else SVG; a PDF is for a paper, not Markdown
        for plot in sorted(plots, key=lambda plot: plot.suffix != ".png"):
            if plot.suffix in (".png", ".svg"):
                images.setdefault(plot.stem, plot.name)
        links = "".join(f"\n![{stem}]({name})\n" for stem, name in images.items())
        (out_dir / "report.md").write_text(text + links, encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot write the report into {str(out_dir)!r}: {error.strerror or error}") from None
    print(text, end="")
    print(f"\nrayfed: wrote {', '.join(['report.md', *(plot.name for plot in plots)])} into {out_dir}")
    return 0


def _names(option: str, value: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise ConfigError(f"{option} takes comma-separated names, got {value!r}")
    for name in names:
        if allowed is not None and name not in allowed:
            raise ConfigError(f"{option} {name!r} is not one of {', '.join(allowed)}")
    return list(dict.fromkeys(names))


def _check_metrics(metrics: list[str], runs: list[Run]) -> None:
    if not runs:
        return
    known = set().union(*(run.columns for run in runs))
    for metric in metrics:
        if metric not in known:
            raise ConfigError(f"--metric {metric!r} is no numeric key of the runs' metrics.jsonl "
                              f"(they have {', '.join(sorted(known))})")


def _read_runs(paths: list[Path]) -> tuple[list[Run], list[Unusable], list[dict]]:
    """The runs that can be averaged, the run directories that cannot, and every config that could be read."""
    runs, unusable, configs = [], [], []
    for path in paths:
        config = read_config(path)
        if isinstance(config, Unusable):
            unusable.append(config)
            continue
        configs.append(config)
        run = read_run(path, config)
        (unusable if isinstance(run, Unusable) else runs).append(run)
    return runs, unusable, configs
