"""The table of issue 24's closing note: every edit of tests/checkpoint_damage.py on every
registered algorithm's checkpoint (and a plugin's), resumed with `rayfed run --resume`: the exit
code, the number of stderr lines, and the line's reason; then whether the undamaged copy resumes
to the uninterrupted run's bits. Writes table.md beside this file.

    PYTHONPATH=. python experiments/checkpoint_content/table.py
"""
from __future__ import annotations

import contextlib
import io
import shutil
import sys
import tempfile
from pathlib import Path

import torch

import rayfed
from rayfed.cli import main
from tests.checkpoint_damage import CASES, PLUGIN, algorithms, build, load_body, rewrite

PLUGIN_ALGORITHM = "drift_fedavg"


def resume(run_dir: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", "--resume", str(run_dir), "--quiet"])
    return code, err.getvalue()


def outcome(source: Path, case, every_digest: bool, scratch: Path) -> str:
    run_dir = scratch / "edited"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(source, run_dir)
    rewrite(run_dir, case.edit, every_digest)
    code, err = resume(run_dir)
    lines = err.splitlines()
    reason = lines[0].split("checkpoint.pt: ", 1)[-1] if lines else ""
    return f"exit {code}, {len(lines)} line: {reason}"


def main_table() -> None:
    root = Path(tempfile.mkdtemp(prefix="rayfed-table-"))
    plugin = root / "drift_plugin.py"
    plugin.write_text(PLUGIN)
    rows, bitwise = [], []
    for name in [*algorithms(), PLUGIN_ALGORITHM]:
        source, whole = build(root, name, plugin if name == PLUGIN_ALGORITHM else None)
        _, payload = load_body(source / "checkpoint.pt")
        for case_name, case in CASES.items():
            if not case.applies(payload):
                continue
            content = case.content(payload) if callable(case.content) else case.content
            rows.append((case_name, name, outcome(source, case, False, root),
                         outcome(source, case, True, root) if content else "(digest only)"))
        control = root / "control"
        shutil.rmtree(control, ignore_errors=True)
        shutil.copytree(source, control)
        resumed = rayfed.resume(control, progress=False)
        bitwise.append((name, torch.equal(resumed.params, whole.params) and torch.equal(resumed.buffers, whole.buffers)))
        print(name, file=sys.stderr)
    out = ["| case | algorithm | header digest recomputed | every recorded digest recomputed |", "|---|---|---|---|"]
    out += [f"| {case} | {name} | {first} | {second} |" for case, name, first, second in rows]
    out += ["", "| undamaged control | resumed bitwise |", "|---|---|"]
    out += [f"| {name} | {same} |" for name, same in bitwise]
    (Path(__file__).parent / "table.md").write_text("\n".join(out) + "\n")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main_table()
