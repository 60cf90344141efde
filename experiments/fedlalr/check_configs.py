"""Validates every paper-scenario config (e2_* to e5_*) with every method of hparams.py's TABLE, as
`rayfed config FILE $(python hparams.py DATASET METHOD)` does (the same rayfed.load_config).
Without the datasets' files the expected outcome is the one missing-files error; the CIFAR configs
are then validated again with data.dataset=cifar10_random (random tensors, CIFAR-10's shapes), so
that everything checked after the files (model vs inputs, memory estimate, ...) is checked too.
Exit status 1 if any other error occurs. Run from the repository root:
    python experiments/fedlalr/check_configs.py
"""
import pathlib
import sys

import yaml

from hparams import TABLE
from rayfed.preflight import load_config
from rayfed.errors import ConfigError

HERE = pathlib.Path(__file__).parent
MISSING = ("files missing", "not found", "does not exist", "holds no .json")


def check(path, overrides):
    try:
        config = load_config(str(path), overrides)
        return "ok", config
    except ConfigError as error:
        text = str(error).splitlines()[0]
        return ("missing files" if any(m in text for m in MISSING) else "ERROR"), text


bad = 0
for path in sorted(HERE.glob("e[2-5]_*.yaml")):
    dataset = yaml.safe_load(path.read_text())["data"]["dataset"]
    for method, entry in TABLE[dataset].items():
        overrides = [f"{key}={value}" for key, value in entry.items()]
        status, detail = check(path, overrides)
        line = f"{path.name:42s} {method:14s} {status}"
        if status == "ERROR":
            bad += 1
            line += f": {detail}"
        if dataset.startswith("cifar"):
            status2, detail2 = check(path, overrides + ["data.dataset=cifar10_random"])
            line += f" | as cifar10_random: {status2}"
            if status2 != "ok":
                bad += 1
                line += f": {detail2}"
        print(line)
print(f"{bad} unexpected error(s)")
sys.exit(1 if bad else 0)
