"""GPU checks (experiments/scaling/README.md, GPU): LeNet-5 runs on one GPU give the same bits on both engines and
with 1-4 workers sharing it, workers on one GPU map one copy of the data, and the server computes there by default.
Prints one line per run (with each process's GPU memory, from nvidia-smi) and per comparison; writes
$OUT/checks.json.

    python experiments/scaling/gpu_checks.py
"""
import json
import os
import subprocess
import tempfile
import threading
import time

import ray
import torch

import rayfed
from rayfed.preflight import load_config

if not torch.cuda.is_available():
    raise SystemExit("gpu_checks: no GPU here")
OUT = os.environ.get("OUT", ".")
gpus_on_node = torch.cuda.device_count()
ray.init(address="local", include_dashboard=False, log_to_driver=False)
LENET = ["algorithm.name=fedavg", "data.dataset=cifar10_random", "data.partition=iid", "data.num_clients=100",
         "model.name=lenet5", "train.clients_per_round=10", "train.local_steps=5", "train.batch_size=64",
         "train.rounds=2", "train.eval_every=2"]
results = {}
apps = {}


def sample_gpu_apps(stop):
    while not stop.is_set():
        try:
            text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=5).stdout
            for line in text.strip().splitlines():
                pid, mem = [x.strip() for x in line.split(",")]
                try:
                    name = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:60]
                except OSError:
                    name = "?"
                apps[(pid, name)] = max(apps.get((pid, name), 0), int(mem))
        except Exception as error:
            apps[("err", str(error)[:60])] = 0
        time.sleep(0.5)


def run(name, overrides, base=LENET):
    apps.clear()
    stop = threading.Event(); sampler = threading.Thread(target=sample_gpu_apps, args=(stop,)); sampler.start()
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            result = rayfed.run(load_config(None, [*base, *overrides]), run_dir=os.path.join(scratch, "r"), progress=False)
        params = result.params.cpu()
        status = "ok"
    except Exception as error:
        params, status = None, f"FAILED {type(error).__name__}: {str(error)[:300]}"
    stop.set(); sampler.join()
    seconds = time.perf_counter() - started
    results[name] = {"status": status, "seconds": round(seconds, 1),
                     "gpu_apps_mib": {f"{pid} {n}": m for (pid, n), m in apps.items()}}
    print(f"[{name}] {status} {seconds:.1f}s gpu apps: {results[name]['gpu_apps_mib']}", flush=True)
    return params


def compare(label, a, b):
    if a is None or b is None:
        verdict = "n/a"
    else:
        diff = float((a.double() - b.double()).abs().max())
        verdict = "bitwise" if torch.equal(a, b) else f"max|diff| {diff:.3g}"
    results.setdefault("compare", {})[label] = verdict
    print(f"COMPARE {label}: {verdict}", flush=True)


def section(title):
    print(f"\n===== {title} ({time.strftime('%H:%M:%S')})", flush=True)


# A worker's exact sum compacted on its GPU, pickled and added into an accumulator on the server's GPU gives the
# limbs and the value the CPU gives (rayfed.exact_sum.CompactSum); with the time each step takes there. The engine's
# processes use deterministic algorithms, which change how index_add_ runs on a GPU: both ways.
section("exact sums compacted on the GPU")
import pickle  # noqa: E402
from rayfed.exact_sum import ExactSum  # noqa: E402

generator = torch.Generator().manual_seed(0)
LENET_SIZE = 941834
scales = {"model changes": 10.0 ** torch.empty(LENET_SIZE).uniform_(-4, -1, generator=generator),
          "awkward": torch.exp2(torch.randint(-150, 120, (5, LENET_SIZE), generator=generator).float())}
checked = {}
for label, scale in scales.items():
    rows = (torch.rand(5, LENET_SIZE, generator=generator) - 0.5) * scale
    on_cpu = ExactSum(rows.shape[1:]).add(rows, [50, 7, 2 ** 31 - 1, 1, 0])
    reference = ExactSum(rows.shape[1:]).merge(on_cpu).merge(on_cpu)
    reference.normalise()
    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic)
        on_gpu = ExactSum(rows.shape[1:], "cuda").add(rows.cuda(), [50, 7, 2 ** 31 - 1, 1, 0])
        torch.cuda.synchronize()
        started = time.perf_counter()
        wire = pickle.dumps(on_gpu.compact(), protocol=5)
        compacted_s = time.perf_counter() - started
        started = time.perf_counter()
        total = ExactSum(rows.shape[1:], "cuda").merge(pickle.loads(wire)).merge(on_gpu.compact())
        value = total.value()
        torch.cuda.synchronize()
        merged_s = time.perf_counter() - started
        total.normalise()
        checked[f"{label}, deterministic {deterministic}"] = {
            "limbs_equal_cpu": torch.equal(total.limbs.cpu(), reference.limbs),
            "value_equal_cpu": torch.equal(value.cpu(), reference.value()),
            "wire_mb": round(len(wire) / 1e6, 2), "compact_and_pickle_s": round(compacted_s, 4),
            "merge_two_and_value_s": round(merged_s, 4)}
torch.use_deterministic_algorithms(False)
results["exact_sum_compacted"] = checked
print(checked, flush=True)

# What Ray shows actors that reserve no GPU and actors that share one, and whether a CUDA IPC mapping outlives the
# process that exported it (rayfed.engine.gpu_share relies on it).
section("probe: what a num_gpus=0 actor and fractional actors see")


@ray.remote
class Probe:
    def see(self):
        return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "cuda": torch.cuda.is_available(),
                "uuid": str(torch.cuda.get_device_properties(0).uuid) if torch.cuda.is_available() else None,
                "gpu_ids": ray.get_gpu_ids()}

    def export(self, n):
        from torch.multiprocessing.reductions import reduce_tensor
        self.kept = torch.arange(n, dtype=torch.float32, device="cuda")
        return reduce_tensor(self.kept)[1], float(self.kept.sum())

    def import_(self, args):
        from torch.multiprocessing.reductions import rebuild_cuda_tensor
        self.imported = rebuild_cuda_tensor(*args)
        return float(self.imported.sum())

    def reread(self):
        torch.cuda.synchronize()
        return float(self.imported.sum())

    def fill(self, n):
        self.junk = torch.full((n,), 7.0, device="cuda")
        torch.cuda.synchronize()
        return True


probes = []
try:
    zero = Probe.options(num_gpus=0).remote(); half_a = Probe.options(num_gpus=0.5).remote()
    half_b = Probe.options(num_gpus=0.5).remote()
    probes = [zero, half_a, half_b]
    results["probe_see"] = {"zero": ray.get(zero.see.remote()), "half_a": ray.get(half_a.see.remote()),
                            "half_b": ray.get(half_b.see.remote())}
    print(results["probe_see"], flush=True)
    if gpus_on_node:
        n = 50_000_000
        args, total = ray.get(half_a.export.remote(n))
        got = ray.get(half_b.import_.remote(args))
        results["ipc"] = {"exported_sum": total, "imported_sum": got}
        ray.kill(half_a)
        time.sleep(2)
        try:
            results["ipc"]["after_exporter_killed"] = ray.get(half_b.reread.remote())
            filler = Probe.options(num_gpus=0.5).remote()
            probes.append(filler)
            ray.get(filler.fill.remote(4 * n))
            results["ipc"]["after_new_allocation"] = ray.get(half_b.reread.remote())
        except Exception as error:
            results["ipc"]["after_kill_error"] = f"{type(error).__name__}: {str(error)[:200]}"
        print(results["ipc"], flush=True)
except Exception as error:
    results["probe_error"] = f"{type(error).__name__}: {str(error)[:300]}"
    print(results["probe_error"], flush=True)
# The GPU shares they hold would leave the runs below waiting for resources forever.
for actor in probes:
    ray.kill(actor)
time.sleep(1)

section("LeNet-5 FedAvg on the GPU: engines and worker counts")
local = run("local gpu", ["engine.backend=local", "engine.worker_gpus=1"])
compare("local gpu run twice", local, run("local gpu again", ["engine.backend=local", "engine.worker_gpus=1"]))
compare("ray 1 worker (1 GPU), server in driver", local,
        run("ray 1w driver", ["engine.num_workers=1", "engine.worker_gpus=1", "engine.server=driver"]))
compare("ray 2 workers (0.5), server actor sharing by default", local,
        run("ray 2w actor", ["engine.num_workers=2", "engine.worker_gpus=0.5"]))
compare("ray 4 workers (0.25) mapping one copy, server in driver", local,
        run("ray 4w driver", ["engine.num_workers=4", "engine.worker_gpus=0.25", "engine.server=driver"]))
partial = run("local gpu partial sums", ["engine.backend=local", "engine.worker_gpus=1", "engine.partial_sums=true"])
compare("partial sums vs uploads (float32 rounding expected)", local, partial)
compare("partial sums: ray 3 workers (0.3) vs local", partial,
        run("ray 3w partial", ["engine.num_workers=3", "engine.worker_gpus=0.3", "engine.partial_sums=true"]))
compare("partial sums: ray 4 workers (0.25), server actor vs local", partial,
        run("ray 4w partial actor", ["engine.num_workers=4", "engine.worker_gpus=0.25", "engine.partial_sums=true"]))

section("stateful and memory algorithms on the GPU")
for algorithm in ("mifa", "gradma"):
    extra = [f"algorithm.name={algorithm}"]
    a = run(f"{algorithm} local gpu", ["engine.backend=local", "engine.worker_gpus=1", *extra])
    compare(f"{algorithm}: ray 2 workers (0.5) vs local", a,
            run(f"{algorithm} ray 2w", ["engine.num_workers=2", "engine.worker_gpus=0.5", *extra]))
    compare(f"{algorithm}: ray 4 workers (0.25) vs local", a,
            run(f"{algorithm} ray 4w", ["engine.num_workers=4", "engine.worker_gpus=0.25", *extra]))

section("vectorised clients on the GPU (logreg)")
TINY = ["algorithm.name=fedavg", "data.dataset=synthetic", "data.synthetic_max_samples=64", "model.name=logreg",
        "data.num_clients=200", "train.clients_per_round=20", "train.local_steps=5", "train.batch_size=32",
        "train.rounds=3", "train.eval_every=3", "engine.vectorize=true"]
vec = run("vec local gpu", ["engine.backend=local", "engine.worker_gpus=1"], TINY)
compare("vectorised: ray 2 workers (0.5) vs local", vec,
        run("vec ray 2w", ["engine.num_workers=2", "engine.worker_gpus=0.5"], TINY))

ray.shutdown()
with open(os.path.join(OUT, "checks.json"), "w") as out:
    json.dump(results, out, indent=1, default=str)
print("checks done", flush=True)
