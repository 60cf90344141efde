"""`rayfed report DIR... [--group KEY ...] [--target ACC] [--x round|virtual_time_s|bytes] [--out DIR]`."""
from __future__ import annotations

import math
from pathlib import Path

from rayfed.errors import ConfigError
from rayfed.report.groups import check_group_keys, group_runs
from rayfed.report.plots import write_plots
from rayfed.report.runs import Run, Unusable, find_run_dirs, read_config, read_run
from rayfed.report.stats import group_stats
from rayfed.report.table import render_report


def report_command(dirs: list[str], keys: list[str], target: float | None, x: str, out: str | None) -> int:
    if target is not None and not (math.isfinite(target) and 0 <= target <= 1):
        raise ConfigError(f"--target is a test accuracy as a fraction in [0, 1], got {target}")
    runs, unusable, configs = _read_runs(find_run_dirs(dirs))
    if configs:     # where no config.yaml could be read, the report says so instead
        check_group_keys(keys, configs)
    groups = group_runs(runs, keys)
    stats = [group_stats(group, target) for group in groups if not group.mismatches]
    text = render_report(keys, stats, groups, unusable, target)
    out_dir = Path(out) if out is not None else Path(dirs[0]) if len(dirs) == 1 else Path("report")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        plots = write_plots(keys, stats, x, out_dir) if stats else []
        links = "".join(f"\n![{plot.stem}]({plot.name})\n" for plot in plots)
        (out_dir / "report.md").write_text(text + links, encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot write the report into {str(out_dir)!r}: {error.strerror or error}") from None
    print(text, end="")
    print(f"\nrayfed: wrote {', '.join(['report.md', *(plot.name for plot in plots)])} into {out_dir}")
    return 0


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
