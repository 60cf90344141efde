"""Rank agreement between the rankings measured here and GradMA's tables (Luo et al., CVPR 2023,
arXiv:2302.14307, Sec. 6.2, Table 1: top test accuracy, Table 2: rounds to a target accuracy), over the
methods both have: Kendall's tau (scipy.stats.kendalltau, tau-b: ties allowed) and Spearman's rho
(scipy.stats.spearmanr), each with its two-sided p-value; GradMA's, GradMA-S's and GradMA-W's rank in each
column, the paper's W / S / B groups (Sec. 6.1) by their median, the W -> B pairs' gains and tau's range with one
method left out, at T = 30 and, for each omega column whose every method has ended, at T = 500. Reads the
committed tables, runs nothing:

    python experiments/gradma/rank_agreement.py      # writes experiments/gradma/rank_agreement.md

Inputs: mnist5k/results/table_omega{0.01,0.1}.md (the study's selected settings with the paper's MNIST / MLP,
S = 10 numbers beside them, written by mnist5k/make_tables.py, which runs this script after them) and the
digits sweep's selection (digits_results/selection.json, selected/report.md); where they exist,
mnist5k/results_T500/ and its first_run/ (the same study at the paper's horizon, make_tables.py --rounds 500).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from scipy.stats import kendalltau, spearmanr

HERE = Path(__file__).parent
NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedmlb": "FedMLB", "moon": "MOON", "scaffold": "Scaffold",
         "gradma_w": "GradMA-W", "fedavgm": "FedAvgM", "mifa": "MIFA", "mifam": "MIFAM", "gradma_s": "GradMA-S",
         "fedproxm": "FedProxM", "fedmlbm": "FedMLBM", "moonm": "MOONM", "feddyn": "FedDyn", "mimelite": "MimeLite",
         "gradma": "GradMA"}
# The W -> B pairs of Table 1: a worker-side method and the same with FedAvgM's server momentum.
PAIRS = (("FedAvg", "FedAvgM"), ("FedProx", "FedProxM"), ("FedMLB", "FedMLBM"), ("MOON", "MOONM"))


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def table(path: Path) -> list[dict]:
    """The markdown table's rows as {header: cell}."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    header = cells(lines[0])
    return [dict(zip(header, cells(line))) for line in lines[2:]]


def number(cell: str) -> float | None:
    """'56.93 ± 1.85' -> 56.93, '493' -> 493, '—' / 'never' -> None."""
    head = cell.split("±")[0].split("(")[0].replace(",", "").strip()
    try:
        return float(head)
    except ValueError:
        return None


def agreement(ours: dict[str, float | None], paper: dict[str, float | None]) -> tuple[int, float, float, float, float]:
    both = [name for name in ours if ours[name] is not None and paper.get(name) is not None]
    x, y = [ours[name] for name in both], [paper[name] for name in both]
    tau, p_tau = kendalltau(x, y)
    rho, p_rho = spearmanr(x, y)
    return len(both), float(tau), float(p_tau), float(rho), float(p_rho)


def rank(values: dict[str, float | None], name: str, best_high: bool) -> str:
    """1-based rank of `name` (ties share the better rank) among the methods with a value."""
    known = {key: value for key, value in values.items() if value is not None}
    if values.get(name) is None:
        return "—"
    better = sum(1 for value in known.values() if (value > values[name] if best_high else value < values[name]))
    return f"{better + 1} of {len(known)}"


def row(label: str, ours: dict, paper: dict) -> str:
    n, tau, p_tau, rho, p_rho = agreement(ours, paper)
    return f"| {label} | {n} | {tau:+.2f} | {p_tau:.2f} | {rho:+.2f} | {p_rho:.2f} |"


# The study at the paper's horizon, per run of it: its first run's sweep directories were lost with their machine
# after 151 trials; what it had tabulated is kept apart from the second run's tables.
HORIZON_RUNS = (("mnist5k/results_T500/first_run", "first run (2026-11-28/29, 151 trials, then lost)"),
                ("mnist5k/results_T500", "second run (from 2026-11-29)"))


def study_table(path: Path) -> tuple[list[dict], dict[str, dict[str, float | None]], str]:
    """A make_tables.py table: its rows, its columns by method (top accuracy and rounds, here and in the paper)
    and the rounds comparison's label. Rounds here are read at the table's first target, the one its report
    gets (at omega = 0.1 below the paper's 95%, which no method reaches on the sample)."""
    rows = table(path)
    target = next(key for key in rows[0] if key.startswith("rounds to "))
    paper_target = next(key for key in rows[0] if key.startswith("paper: rounds to "))
    label = f"{target} vs Table 2" + (f" ({paper_target.removeprefix('paper: ')})"
                                      if paper_target != f"paper: {target}" else "")
    return rows, {"top": {r["method"]: number(r["top accuracy (%)"]) for r in rows},
                  "rounds": {r["method"]: number(r[target]) for r in rows},
                  "paper_top": {r["method"]: number(r["paper: top accuracy (%)"]) for r in rows},
                  "paper_rounds": {r["method"]: number(r[paper_target]) for r in rows}}, label


def study_sections(rows: list[dict], columns: dict[str, dict[str, float | None]]) -> tuple[list[str], ...]:
    """A complete study column's table rows, each missing its leading study cells: GradMA's, GradMA-S's and
    GradMA-W's ranks; the paper's groups by their median; the W -> B pairs' gains per seed and by their means."""
    top, rounds, paper_top, paper_rounds = (columns[key] for key in ("top", "rounds", "paper_top", "paper_rounds"))
    ranks = [f"| {name} | {rank(top, name, True)} | {rank(paper_top, name, True)} | "
             f"{rank(rounds, name, False)} | {rank(paper_rounds, name, False)} |"
             for name in ("GradMA", "GradMA-S", "GradMA-W")]
    groups = []
    for group in "WSB":
        members = [r["method"] for r in rows if r["group"] == group]
        groups.append(f"| {group} | {', '.join(members)} | {statistics.median(top[m] for m in members):.2f} | "
                      f"{statistics.median(paper_top[m] for m in members):.2f} |")
    seeds = {r["method"]: [float(v) for v in r["per seed"].split(",")] for r in rows}
    pairs = []
    for worker, both in PAIRS:
        gains = [b - w for w, b in zip(seeds[worker], seeds[both])]
        pairs.append(f"| {worker} → {both} | {', '.join(f'{g:+.1f}' for g in gains)} | "
                     f"{top[both] - top[worker]:+.2f} | {paper_top[both] - paper_top[worker]:+.2f} |")
    return ranks, groups, pairs


def left_out(ours: dict[str, float | None], paper: dict[str, float | None]) -> str:
    """Kendall's tau with all methods and its range as each one is left out: the method at each end, its p."""
    n, tau = agreement(ours, paper)[:2]
    without = sorted((agreement({k: v for k, v in ours.items() if k != name}, paper)[1:3], name) for name in ours)
    (low, p_low), low_name = without[0]
    (high, p_high), high_name = without[-1]
    return (f"| {n} | {tau:+.2f} | {low:+.2f} without {low_name} ({p_low:.2f}) | "
            f"{high:+.2f} without {high_name} ({p_high:.2f}) |")


def horizon_rows() -> list[str]:
    """The study at the paper's horizon (make_tables.py --rounds 500), each run of it, against
    Tables 1 and 2 and against the T = 30 study, over the methods whose every trial has ended (a sweep still
    running leaves some out; n says how many). The second run has every method of the first, with the same
    numbers (experiments/gradma/README.md, C13)."""
    out = []
    for omega in ("0.01", "0.1"):
        top_30 = {r["method"]: number(r["top accuracy (%)"])
                  for r in table(HERE / "mnist5k" / "results" / f"table_omega{omega}.md")}
        runs = [(run, *study_table(HERE / directory / f"table_omega{omega}.md")[1:])
                for directory, run in HORIZON_RUNS if (HERE / directory / f"table_omega{omega}.md").exists()]
        for run, columns, rounds_label in runs:
            for label, ours, theirs in ((f"top accuracy vs Table 1 (MNIST, S = 10, ω = {omega})", columns["top"],
                                         columns["paper_top"]),
                                        (rounds_label, columns["rounds"], columns["paper_rounds"]),
                                        ("top accuracy vs the T = 30 study's", columns["top"], top_30)):
                label = f"mnist5k ω = {omega}, T = 500: {label}"
                if sum(1 for name in ours if ours[name] is not None and theirs.get(name) is not None) >= 2:
                    out.append(f"| {run} " + row(label, ours, theirs))
                else:
                    out.append(f"| {run} | {label} | fewer than 2 methods finished | | | | |")
    if not out:
        return []
    return ["", "## At the paper's horizon, T = 500 (mnist5k/results_T500)", "",
            "Over the methods whose every trial has ended in the run: where n is under 16 (a run that is still going, "
            "or the first run, lost after 151 trials), a row speaks for those methods only.", "",
            "| run | comparison | n | tau | p (tau) | rho | p (rho) |", "|---|---|---|---|---|---|---|", *out]


def render() -> str:
    """rank_agreement.md's text, from the committed tables."""
    out = ["# Rank agreement with GradMA's Table 1 and Table 2 (arXiv:2302.14307)", "",
           f"Written by `{Path(__file__).name}` from the committed tables. tau: Kendall's tau-b, rho: Spearman's "
           "rho, p: two-sided p-values (scipy.stats); n: the methods with a value on both sides. Rounds: lower is "
           "better on both sides, so a positive coefficient is agreement in either table.", "",
           "| comparison | n | tau | p (tau) | rho | p (rho) |", "|---|---|---|---|---|---|"]
    ranks, groups, pairs, influence = [], [], [], []
    mnist = {}
    for rounds_t, directory in (("30", "mnist5k/results"), ("500", "mnist5k/results_T500")):
        for omega in ("0.01", "0.1"):
            path = HERE / directory / f"table_omega{omega}.md"
            if not path.exists():
                continue
            rows, columns, rounds_label = study_table(path)
            if rounds_t == "30":
                mnist[omega] = columns["paper_top"], columns["paper_rounds"]
                out.append(row(f"mnist5k ω = {omega}, T = 30: top accuracy vs Table 1 (MNIST, S = 10, ω = {omega})",
                               columns["top"], columns["paper_top"]))
                out.append(row(f"mnist5k ω = {omega}, T = 30: {rounds_label}", columns["rounds"],
                               columns["paper_rounds"]))
            # A column still running would give groups and pairs over some of their members only.
            if any(value is None for value in columns["top"].values()):
                continue
            study = f"mnist5k ω = {omega}, T = {rounds_t}"
            section = study_sections(rows, columns)
            ranks += [f"| {study} {line}" for line in section[0]]
            groups += [f"| {omega} | {rounds_t} {line}" for line in section[1]]
            pairs += [f"| {omega} | {rounds_t} {line}" for line in section[2]]
            influence.append(f"| {study} {left_out(columns['top'], columns['paper_top'])}")
    selection = json.loads((HERE / "digits_results" / "selection.json").read_text())
    digits_best = {NAMES[g["group"]["algorithm.name"]]: g["mean_best_test_accuracy"] for g in selection["groups"]}
    digits_rounds = {NAMES[r["algorithm.name"]]: number(r["rounds to 0.9"])
                     for r in table(HERE / "digits_results" / "selected" / "report.md")}
    paper_top, paper_rounds = mnist["0.1"]
    out.append(row("digits (8x8 stand-in), 9 methods: best accuracy vs Table 1 (MNIST, S = 10, ω = 0.1)",
                   digits_best, {name: paper_top[name] for name in digits_best}))
    out.append(row("digits, 9 methods: rounds to 0.9 vs Table 2 (MNIST, S = 10, ω = 0.1, rounds to 95%)",
                   digits_rounds, {name: paper_rounds[name] for name in digits_rounds}))
    for name in ("GradMA", "GradMA-S", "GradMA-W"):
        ranks.append(f"| digits (9 methods) | {name} | {rank(digits_best, name, True)} | "
                     f"{rank({n: paper_top[n] for n in digits_best}, name, True)} | "
                     f"{rank(digits_rounds, name, False)} | "
                     f"{rank({n: paper_rounds[n] for n in digits_rounds}, name, False)} |")
    paper_top, paper_rounds = mnist["0.01"]
    # synthetic_table.py's results (seeds 0-2): top accuracy (%) and rounds to its target, six methods.
    synthetic = {r["algorithm"]: (r["top_mean"], r["rounds_to_target"])
                 for r in json.loads((HERE / "synthetic_results.json").read_text())["rows"]}
    out.append(row("synthetic (logistic regression), 6 methods: top accuracy vs Table 1 (MNIST, S = 10, ω = 0.01)",
                   {n: v[0] for n, v in synthetic.items()}, {n: paper_top[n] for n in synthetic}))
    out.append(row("synthetic, 6 methods: rounds to 75% vs Table 2 (MNIST, S = 10, ω = 0.01, rounds to 45%)",
                   {n: v[1] for n, v in synthetic.items()}, {n: paper_rounds[n] for n in synthetic}))
    out += ["", "## Ranks (1 = best: highest accuracy, fewest rounds; ties share the better rank)", "",
            "Paper columns: the Table 1 / Table 2 column the row is compared with above, over the same methods.", "",
            "| study | method | top accuracy rank here | paper's | rounds rank here | paper's |",
            "|---|---|---|---|---|---|", *ranks,
            "", "## The paper's groups (Sec. 6.1: W worker side, S server side, B both), median top accuracy (%)", "",
            "| ω | T | group | methods | median here (mnist5k) | median, Table 1 (MNIST, S = 10) |",
            "|---|---|---|---|---|---|", *groups,
            "", "## W → B pairs: the same local method with FedAvgM's server momentum (top accuracy, points)", "",
            "| ω | T | pair | gain here per seed (0, 1, 2) | gain here, means | gain, Table 1 |",
            "|---|---|---|---|---|---|", *pairs,
            "", "## Top accuracy vs Table 1 with one method left out", "",
            "Kendall's tau over the n - 1 methods left when each method is removed in turn: how far one method's place "
            "carries the agreement.", "",
            "| study | n | tau, all | lowest tau, one left out (p) | highest tau, one left out (p) |",
            "|---|---|---|---|---|", *influence]
    out += horizon_rows()
    return "\n".join(out) + "\n"


def main() -> None:
    text = render()
    (HERE / "rank_agreement.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
