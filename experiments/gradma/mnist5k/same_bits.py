"""Whether two trees of rayfed give this study the same bits. A study that runs for days runs from a tree kept
apart (a worktree at a fixed commit), so that what is merged meanwhile cannot reach it half done; its results
speak for the main branch only where both trees give every method the same bits. This runs one trial of each
of the study's 16 methods from the rayfed package on the Python path (the points of this checkout's omega = 0.01
sweep files at eta_l = 0.1, eta_g = 1, seed 1, shortened to 12 rounds: only the package differs between the two
trees' digests) and writes a digest of each run's final parameters, buffers and metrics; --compare says which
methods differ. From the repository's root:
  PYTHONPATH=/path/to/study/tree python experiments/gradma/mnist5k/same_bits.py study.json
  python experiments/gradma/mnist5k/same_bits.py main.json
  python experiments/gradma/mnist5k/same_bits.py --compare study.json main.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import rayfed
from rayfed.metrics import WALL_CLOCK_KEYS
from rayfed.sweep.spec import read_sweep

HERE = Path(__file__).parent
ROUNDS = 12
POINT = {"algorithm.lr_local": 0.1, "algorithm.lr_global": 1.0, "seed": 1}
METHODS = 16


def one_trial_per_method() -> dict[str, tuple[str, ...]]:
    """Each method's overrides at POINT (FedDyn has no eta_g), from the sweep files as the study reads them."""
    chosen = {}
    with tempfile.TemporaryDirectory() as scratch:
        for sweep_file in sorted(HERE.glob("sweep_*_omega0.01.yaml")):
            for trial in read_sweep(str(sweep_file), [], Path(scratch) / "base.yaml").trials:
                point = dict(trial.point)
                if all(point.get(key, value) == value for key, value in POINT.items()):
                    chosen.setdefault(point["algorithm.name"], []).append(trial.overrides)
    if len(chosen) != METHODS or any(len(found) != 1 for found in chosen.values()):
        raise SystemExit(f"expected one trial for each of {METHODS} methods at {POINT}, found "
                         f"{ {name: len(found) for name, found in chosen.items()} }")
    return {name: found[0] for name, found in chosen.items()}


def digests() -> dict[str, str]:
    found = {}
    for name, overrides in one_trial_per_method().items():
        config = rayfed.load_config(str(HERE / "base_omega0.01.yaml"), [*overrides, f"train.rounds={ROUNDS}"])
        with tempfile.TemporaryDirectory() as scratch:
            result = rayfed.run(config, run_dir=Path(scratch) / "run", progress=False)
        history = [{key: value for key, value in record.items() if key not in WALL_CLOCK_KEYS}
                   for record in result.history]
        digest = hashlib.sha256(result.params.numpy().tobytes() + result.buffers.numpy().tobytes()
                                + json.dumps(history).encode())
        found[name] = digest.hexdigest()
        print(f"{name}: {found[name][:16]}", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="where to write the digests (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two digest files to compare")
    args = parser.parse_args()
    if args.compare:
        first, second = (json.loads(Path(path).read_text()) for path in args.compare)
        differ = sorted(name for name in first.keys() | second.keys() if first.get(name) != second.get(name))
        print(f"{len(first.keys() | second.keys()) - len(differ)} methods the same bits; differ: {differ or 'none'}")
        sys.exit(1 if differ else 0)
    if not args.out:
        parser.error("give a file to write the digests to, or --compare A B")
    print(f"rayfed from {Path(rayfed.__file__).parent}", flush=True)
    Path(args.out).write_text(json.dumps(digests(), indent=1) + "\n")


if __name__ == "__main__":
    main()
