"""The report as Markdown: one row per averaged group, then what was left out and why."""
from __future__ import annotations

import math
from collections import Counter

from rayfed.metrics import human_bytes
from rayfed.report.groups import UNSET, Group, label, render
from rayfed.report.runs import Unusable
from rayfed.report.stats import GroupStats, Spread

NO_VALUE = "–"
NOT_FINITE = "not finite"


def render_report(keys: list[str], stats: list[GroupStats], groups: list[Group], unusable: list[Unusable],
                  notes: list[str]) -> str:
    """`notes`: paragraphs between the count of runs and the table (how the rows were chosen)."""
    averaged = sum(len(s.group.runs) for s in stats)
    sections = [["# rayfed report"], [f"{averaged} run(s) averaged in {len(stats)} group(s)."]]
    sections += [[note] for note in notes]
    if stats:
        sections += [_table(keys, stats), _footnote(stats)]
    left_out = _left_out(keys, groups, unusable) + _not_finite(keys, stats)
    if left_out:
        sections += [["## Not averaged"], left_out]
    return "\n\n".join("\n".join(section) for section in sections) + "\n"


def _target_name(stats: list[GroupStats]) -> str | None:
    """How the target columns name the target: its value where the groups share one, "target" where
    they differ (a target column then says which), None where no group has one."""
    targets = {s.target for s in stats} - {None}
    if not targets:
        return None
    return f"{targets.pop():g}" if len(targets) == 1 else "target"


def _table(keys: list[str], stats: list[GroupStats]) -> list[str]:
    target = _target_name(stats)
    header = [*keys, "seeds", "best test accuracy", "final test accuracy"]
    if target == "target":
        header.append("target")
    if target is not None:
        header += [f"rounds to {target}", f"virtual s to {target}", f"bytes to {target}"]
    private = any(s.epsilon is not None for s in stats)
    if private:
        header.append("epsilon")
    header += ["wall s per run", "status"]
    rows = [header, ["---"] * len(header)]
    for s in stats:
        row = [*(NO_VALUE if value == UNSET else render(value) for value in s.group.values), str(len(s.group.runs)),
               _spread(s.best), _spread(s.final)]
        if target == "target":
            row.append(NO_VALUE if s.target is None else f"{s.target:g}")
        if target is not None:
            row += _reached_cells(s)
        if private:
            row.append(NO_VALUE if s.epsilon is None else _spread(s.epsilon))
        row += [_number(s.wall_time_s, "{:.1f}"), _statuses(s)]
        rows.append(row)
    return ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def _spread(spread: Spread) -> str:
    if spread.overflow:
        return NOT_FINITE
    return f"{_number(spread.mean, '{:.4f}')} ± {_number(spread.std, '{:.4f}')}"


def _number(value: float, form: str) -> str:
    return NO_VALUE if math.isnan(value) else form.format(value)


def _reached_cells(s: GroupStats) -> list[str]:
    if s.target is None:
        return [NO_VALUE] * 3
    if s.seeds_unknown:
        return ["unknown"] * 3
    if s.reached is None:
        if s.per_seed and s.seeds_reached:
            return [f"{s.seeds_reached} of {len(s.group.runs)} seeds", NO_VALUE, NO_VALUE]
        return ["never"] * 3
    rounds = (str(int(s.reached.round)) if s.reached.round_std is None
              else f"{s.reached.round:.1f} ± {_number(s.reached.round_std, '{:.1f}')}")
    return [rounds, _number(s.reached.virtual_time_s, "{:.1f}"),
            NO_VALUE if math.isnan(s.reached.bytes) else human_bytes(s.reached.bytes)]


def _statuses(s: GroupStats) -> str:
    counts = Counter(run.status for run in s.group.runs)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))


def _footnote(stats: list[GroupStats]) -> list[str]:
    lines = [f"Mean ± sample standard deviation (ddof = 1) over seeds; {NO_VALUE}: one seed, or no value. "
             "Best: each seed's highest evaluated test accuracy; final: its last evaluated one."]
    target = _target_name(stats)
    if target is not None:
        shown = "T" if target == "target" else target
        lines.append(f"To {shown}: the first evaluated round at which the seed-mean test accuracy is ≥ {shown} "
                     "(never: not within the rounds run); virtual seconds and bytes (up + down, cumulative) are "
                     "the seeds' means at that round.")
        if target == "target":
            lines.append("T: the group's target, its runs' train.target_accuracy where no --target is given.")
    if any(s.per_seed and s.target is not None for s in stats):
        lines.append(f"Where a group's runs stopped at their target (status reached_target), the seed-mean curve "
                     f"ends with the first seed that stopped, so rounds to {shown} are each seed's first evaluated "
                     f"round at ≥ {shown} (its target_round, checked against its metrics.jsonl, where {shown} is its "
                     "train.target_accuracy), as mean ± std over seeds, and virtual seconds and bytes the means "
                     "of the seeds' values there; k of n seeds: only k seeds reached it; unknown: a run stopped "
                     "at a lower target of its own before reaching it.")
    if any(s.epsilon is not None for s in stats):
        lines.append("Epsilon: the privacy each run spent (the last dp_epsilon its metrics.jsonl logs, at its "
                     "privacy.delta), mean ± std over seeds.")
    lines.append("Wall s per run: mean of summary.json's wall_time_s. Status: summary.json's status (finished: ran "
                 "train.rounds; reached_target: stopped at its target; privacy_budget_spent: stopped before the round "
                 "that would exceed train.target_epsilon); incomplete: the run wrote no summary.json.")
    return [" ".join(lines)]


def _not_finite(keys: list[str], stats: list[GroupStats]) -> list[str]:
    lines = []
    for s in stats:
        which = [name for name, spread in (("best", s.best), ("final", s.final)) if spread.overflow]
        if which:
            lines.append(f"- {label(keys, s.group.values)}: {' and '.join(which)} test accuracy {NOT_FINITE}: its "
                         f"mean or std over seeds is beyond a double's range, though each seed's value is finite")
    return lines


def _left_out(keys: list[str], groups: list[Group], unusable: list[Unusable]) -> list[str]:
    lines = []
    for group in groups:
        name = label(keys, group.values)
        lines += [f"- {name}: not averaged, {mismatch}" for mismatch in group.mismatches]
        lines += [f"- {name}: {duplicate}" for duplicate in group.duplicates]
    return lines + [f"- {run.path}: {run.reason}" for run in unusable]
