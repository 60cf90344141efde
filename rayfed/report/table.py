"""The report as Markdown: one row per averaged group, then what was left out and why."""
from __future__ import annotations

import math
from collections import Counter

from rayfed.metrics import human_bytes
from rayfed.report.groups import Group, label, render
from rayfed.report.runs import Unusable
from rayfed.report.stats import GroupStats, Spread

NO_VALUE = "–"


def render_report(keys: list[str], stats: list[GroupStats], groups: list[Group], unusable: list[Unusable],
                  target: float | None) -> str:
    averaged = sum(len(s.group.runs) for s in stats)
    sections = [["# rayfed report"], [f"{averaged} run(s) averaged in {len(stats)} group(s)."]]
    if stats:
        sections += [_table(keys, stats, target), _footnote(target)]
    left_out = _left_out(keys, groups, unusable)
    if left_out:
        sections += [["## Not averaged"], left_out]
    return "\n\n".join("\n".join(section) for section in sections) + "\n"


def _table(keys: list[str], stats: list[GroupStats], target: float | None) -> list[str]:
    header = [*keys, "seeds", "best test accuracy", "final test accuracy"]
    if target is not None:
        header += [f"rounds to {target:g}", f"virtual s to {target:g}", f"bytes to {target:g}"]
    header += ["wall s per run", "status"]
    rows = [header, ["---"] * len(header)]
    for s in stats:
        row = [*map(render, s.group.values), str(len(s.group.runs)), _spread(s.best), _spread(s.final)]
        if target is not None:
            row += _reached_cells(s)
        row += [_number(s.wall_time_s, "{:.1f}"), _statuses(s)]
        rows.append(row)
    return ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def _spread(spread: Spread) -> str:
    return f"{_number(spread.mean, '{:.4f}')} ± {_number(spread.std, '{:.4f}')}"


def _number(value: float, form: str) -> str:
    return NO_VALUE if math.isnan(value) else form.format(value)


def _reached_cells(s: GroupStats) -> list[str]:
    if s.reached is None:
        return ["never"] * 3
    return [str(s.reached.round), _number(s.reached.virtual_time_s, "{:.1f}"),
            NO_VALUE if math.isnan(s.reached.bytes) else human_bytes(s.reached.bytes)]


def _statuses(s: GroupStats) -> str:
    counts = Counter(run.status for run in s.group.runs)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))


def _footnote(target: float | None) -> list[str]:
    lines = [f"Mean ± sample standard deviation (ddof = 1) over seeds; {NO_VALUE}: one seed, or no value. "
             "Best: each seed's highest evaluated test accuracy; final: its last evaluated one."]
    if target is not None:
        lines.append(f"To {target:g}: the first evaluated round at which the seed-mean test accuracy is ≥ {target:g} "
                     "(never: not within the rounds run); virtual seconds and bytes (up + down, cumulative) are "
                     "the seeds' means at that round.")
    lines.append("Wall s per run: mean of summary.json's wall_time_s. Status: summary.json's status; "
                 "incomplete: the run wrote no summary.json.")
    return [" ".join(lines)]


def _left_out(keys: list[str], groups: list[Group], unusable: list[Unusable]) -> list[str]:
    lines = []
    for group in groups:
        name = label(keys, group.values)
        lines += [f"- {name}: not averaged, {mismatch}" for mismatch in group.mismatches]
        lines += [f"- {name}: {duplicate}" for duplicate in group.duplicates]
    return lines + [f"- {run.path}: {run.reason}" for run in unusable]
