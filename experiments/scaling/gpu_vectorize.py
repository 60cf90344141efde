"""engine.vectorize on one GPU (experiments/scaling/README.md, GPU), without Ray: LeNet-5's clients trained as
one batch draw the dropout masks their sequential training draws, stay close to sequential training, and
repeat bit for bit. Prints one line per check; writes $OUT/vectorize_checks.json.

    python experiments/scaling/gpu_vectorize.py
"""
import json
import os
import tempfile
import time

import torch
import torch.nn.functional as F

import rayfed
from rayfed.preflight import load_config

if not torch.cuda.is_available():
    raise SystemExit("gpu_vectorize: no GPU here")
OUT = os.environ.get("OUT", ".")
results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}

# A mask drawn by F.dropout on ones keeps the positions F.dropout keeps on activations of the same shape drawn
# from the same generator state: what ClientBatchTask relies on to give each client its sequential masks.
same_positions = []
for seed, shape in [(1, (50, 512)), (2, (50, 128)), (3, (64, 512)), (4, (7, 33))]:
    activations = torch.randn(shape, device="cuda") + 10.0      # no zeros: a kept entry is never 0
    torch.cuda.manual_seed(seed)
    kept = F.dropout(activations, 0.5, training=True) != 0
    torch.cuda.manual_seed(seed)
    same_positions.append(bool(torch.equal(F.dropout(torch.ones(shape, device="cuda"), 0.5, training=True) != 0,
                                           kept)))
results["masks_from_ones_equal_activations_masks"] = same_positions
print("masks from ones keep the activations' positions:", same_positions, flush=True)

LENET = ["algorithm.name=fedavg", "data.dataset=cifar10_random", "data.partition=iid", "data.num_clients=100",
         "model.name=lenet5", "train.clients_per_round=10", "train.local_steps=5", "train.batch_size=64",
         "train.rounds=3", "train.eval_every=3", "engine.backend=local", "engine.worker_gpus=1"]


def run(name, overrides):
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        result = rayfed.run(load_config(None, [*LENET, *overrides]), run_dir=os.path.join(scratch, "r"), progress=False)
    seconds = time.perf_counter() - started
    print(f"[{name}] vectorized={result.summary['vectorized']} {seconds:.1f}s "
          f"final accuracy {result.history[-1].get('test_accuracy')}", flush=True)
    results.setdefault("runs", {})[name] = {"seconds": round(seconds, 1), "vectorized": result.summary["vectorized"],
                                            "history": result.history}
    return result


def compare(label, a, b):
    verdict = {"params_bitwise": bool(torch.equal(a.params, b.params)),
               "params_max_abs_diff": float((a.params.double() - b.params.double()).abs().max()),
               "params_max_abs": float(a.params.abs().max()),
               "buffers_bitwise": bool(torch.equal(a.buffers, b.buffers)),
               "buffers_max_abs_diff": float((a.buffers.double() - b.buffers.double()).abs().max()),
               "train_loss": [(x.get("train_loss"), y.get("train_loss")) for x, y in zip(a.history, b.history)]}
    results.setdefault("compare", {})[label] = verdict
    print(f"COMPARE {label}: {verdict}", flush=True)


sequential = run("sequential", [])
vectorized = run("vectorized", ["engine.vectorize=true"])
compare("vectorized vs sequential", sequential, vectorized)
compare("vectorized twice", vectorized, run("vectorized again", ["engine.vectorize=true"]))
compare("vectorized with partial sums vs without",
        vectorized, run("vectorized partial sums", ["engine.vectorize=true", "engine.partial_sums=true"]))

with open(os.path.join(OUT, "vectorize_checks.json"), "w") as out:
    json.dump(results, out, indent=1, default=str)
print("checks done", flush=True)
