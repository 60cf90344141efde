"""Achieved FLOP/s of packed runs (rayfed sweep --pack) against torch.matmul of the same shapes in the same
process, the machine's practical ceiling (experiments/scaling/README.md, "Packed FLOP/s").

K runs of the GradMA MNIST MLP config (experiments/gradma/mnist5k/base_omega0.01.yaml, vectorised, evaluated
only at the end) differing in the learning rate and seed run as one pack, for T1 and T2 rounds; the time of
a round is the difference over T2 - T1 rounds (set-up cancels). The split is IID with minibatches of B = 40,
the 40 samples each of the 100 clients hold, so that every minibatch is full and its FLOPs are known: every
sampled client's local steps, each a gradient of B rows through the MLP's weight matrices (6 x weights per
row: a forward and two backward products; BatchNorm and activations not counted), once per step for FedAvg
and three times for GradMA-W. The ceiling: the same products as batched torch.matmul calls, (clients, B, fan_in) x
(clients, fan_in, fan_out) with a weight matrix per client, as vmap batches them.

    python experiments/scaling/packed_flops.py [--runs 8] [--t1 2] [--t2 7] [--out FILE.json]
"""
import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

import rayfed
from rayfed.engine.pack import Pack
from rayfed.engine.worker import threads_per_process
from rayfed.preflight import load_config

BASE = "experiments/gradma/mnist5k/base_omega0.01.yaml"
LAYERS = [(784, 200), (200, 100), (100, 10)]
CLIENTS, STEPS, BATCH = 10, 5, 40
GRADIENTS_PER_STEP = {"fedavg": 1, "gradma_w": 3}


def pack_seconds(algorithm: str, runs: int, rounds: int, directory: Path) -> float:
    configs = [load_config(BASE, [f"algorithm.name={algorithm}", f"algorithm.lr_local={0.05 * (1 + k % 4)}",
                                  f"seed={k // 4}", "engine.vectorize=true", f"train.rounds={rounds}",
                                  "data.partition=iid", f"train.batch_size={BATCH}",
                                  f"train.eval_every={rounds}"]) for k in range(runs)]
    pack = Pack()
    started = time.perf_counter()
    outcomes = pack.run([lambda config=config, k=k: rayfed.run(config, run_dir=directory / f"{algorithm}{rounds}_{k}",
                                                               progress=False) for k, config in enumerate(configs)])
    elapsed = time.perf_counter() - started
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return elapsed


def matmul_flops(rows: int, repeats: int = 20) -> float:
    """FLOP/s of the forward and backward products of one step for `rows` clients, as batched matmuls."""
    inputs = [torch.randn(rows, BATCH, fan_in) for fan_in, _ in LAYERS]
    weights = [torch.randn(rows, fan_in, fan_out) for fan_in, fan_out in LAYERS]
    grads = [torch.randn(rows, BATCH, fan_out) for _, fan_out in LAYERS]

    def step():
        for x, w, g in zip(inputs, weights, grads):
            torch.matmul(x, w)
            torch.matmul(x.transpose(1, 2), g)
            torch.matmul(g, w.transpose(1, 2))

    step()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return rows * BATCH * 6 * sum(a * b for a, b in LAYERS) / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--t1", type=int, default=2)
    parser.add_argument("--t2", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args()
    flops_per_gradient_row = 6 * sum(a * b for a, b in LAYERS)
    rows = args.runs * CLIENTS
    per_round = {}
    with tempfile.TemporaryDirectory() as directory:
        for algorithm in GRADIENTS_PER_STEP:
            short = pack_seconds(algorithm, args.runs, args.t1, Path(directory))
            long = pack_seconds(algorithm, args.runs, args.t2, Path(directory))
            per_round[algorithm] = (long - short) / (args.t2 - args.t1)
    # With the runs' own thread count (engine.worker_cpus), which rayfed.run does not leave set behind it.
    torch.set_num_threads(threads_per_process(load_config(BASE)))
    ceiling = matmul_flops(rows)
    report = {"runs": args.runs, "rounds": [args.t1, args.t2], "matmul_flops": ceiling,
              "environment": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                              "threads": torch.get_num_threads()}}
    for algorithm, gradients in GRADIENTS_PER_STEP.items():
        flops = rows * STEPS * gradients * BATCH * flops_per_gradient_row / per_round[algorithm]
        report[algorithm] = {"pack_round_s": per_round[algorithm], "flops": flops, "ratio_to_matmul": flops / ceiling}
        print(f"{algorithm}: {args.runs} runs packed, {per_round[algorithm]:.3f} s per round, "
              f"{flops / 1e9:.2f} GFLOP/s, {flops / ceiling:.3f} of torch.matmul's {ceiling / 1e9:.2f} GFLOP/s "
              f"({torch.get_num_threads()} threads)")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
