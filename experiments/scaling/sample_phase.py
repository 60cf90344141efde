"""The sample phase of a round at N = 10^6: FedAvg on the bench's `million` clients (made on demand) on the local
engine, with the selector and other overrides given. A round's record times the planning of the next round, so
this prints the median of the plans of rounds 3-7 (rounds 2-6's records: round 1's plan builds what the sampler
keeps, and the last record plans nothing) and the final model's sum, to compare trees.

    python experiments/scaling/sample_phase.py selection.selector=md [OVERRIDE ...]
"""
import statistics
import sys
import tempfile

import rayfed
from rayfed.bench.workloads import WORKLOADS

config = rayfed.load_config(None, ["algorithm.name=fedavg", "algorithm.lr_local=0.05", *WORKLOADS["million"],
                                   *sys.argv[1:], "train.rounds=7", "train.eval_every=7"])
with tempfile.TemporaryDirectory() as scratch:
    result = rayfed.run(config, run_dir=f"{scratch}/run", progress=False)
samples = [metrics["phase_s"]["sample"] for metrics in result.history[1:-1]]
print(f"sample phase {statistics.median(samples) * 1e3:.2f} ms, final model sum {result.params.sum().item()!r}")
