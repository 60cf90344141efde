"""Two costs of GradMA, measured in one run on this machine (medians, one torch thread):

1. the server step of GradMA-S at m = 100, S = 10 for d = 1e5 and 1e6, with the Gram matrix of
   the memory kept incrementally vs recomputed from D every round;
2. the local-training cost of GradMA-W relative to FedAvg (3 gradients and a QP per step instead
   of 1 gradient), for the MNIST MLP and the CIFAR-10 LeNet-5 on random inputs of their shapes.

    python experiments/gradma/bench_costs.py [--repeats 5]
"""
import argparse
import statistics
import time

import torch

from rayfed.algorithms.base import RoundInfo, Upload
from rayfed.algorithms.memory import GradientMemory
from rayfed.algorithms.base import AlgorithmContext, build_algorithm
from rayfed.algorithms.local_training import TrainingTask
from rayfed.config import algorithm_section
from rayfed.engine.worker import ClientTask
from rayfed.models import FlatModel, build_model

NUM_CLIENTS, SAMPLED, MEMORY = 1000, 10, 100
# I = 5 local steps of B = 64, the paper's MNIST setting.
LOCAL_STEPS = 5


class NaiveGramMemory(GradientMemory):
    """The baseline: the Gram matrix of D recomputed from scratch whenever the QP asks for it."""

    def _refresh_gram(self, touched_slots):
        pass

    @property
    def gram(self):
        return self.naive_gram()


def make_algorithm(name, blocks=None, **hyper):
    params = algorithm_section({"name": name, "lr_local": 0.01, "lr_global": 1.0, **hyper})
    return build_algorithm(params, AlgorithmContext(param_blocks=tuple(blocks or ())))


def median_seconds(action, repeats):
    action()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def server_step_times(dim, repeats):
    generator = torch.Generator().manual_seed(0)
    results = {}
    for label, memory_class in (("incremental", GradientMemory), ("naive", NaiveGramMemory)):
        algorithm = make_algorithm("gradma_s", memory_size=MEMORY, beta1=0.5, beta2=0.5)
        state = algorithm.server_init(torch.zeros(dim), NUM_CLIENTS)
        state.memory = memory_class(MEMORY, dim, 0.5)
        round = 0

        def step():
            nonlocal state, round
            sampled = tuple(range((round * SAMPLED) % NUM_CLIENTS, (round * SAMPLED) % NUM_CLIENTS + SAMPLED))
            uploads = {c: Upload({"model_change": torch.randn(dim, generator=generator)}, 1) for c in sampled}
            state, _ = algorithm.server_step(state, uploads, RoundInfo(round, sampled, NUM_CLIENTS))
            round += 1

        for _ in range(MEMORY // SAMPLED):      # fill the memory: from here on every round evicts
            step()
        results[label] = median_seconds(step, repeats)
    return results


def local_training_times(model_name, input_shape, repeats):
    torch.manual_seed(0)
    model = FlatModel(build_model(model_name, input_shape, 10))
    inputs, targets = torch.randn(640, *input_shape), torch.randint(0, 10, (640,))
    start = model.params.clone()
    results = {}
    for label, algorithm in (("fedavg", make_algorithm("fedavg")),
                             ("gradma_w", make_algorithm("gradma_w", blocks=model.blocks))):
        def train():
            task = ClientTask(model, inputs, targets, torch.arange(640), 64, torch.Generator().manual_seed(1))
            algorithm.client_train(TrainingTask(task, LOCAL_STEPS), {"params": start}, None)
        results[label] = median_seconds(train, repeats)
    return model.num_params, results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"GradMA-S server step, m = {MEMORY}, S = {SAMPLED} (median of {args.repeats} rounds, memory full)")
    print("| d | incremental Gram (s) | naive Gram (s) | naive / incremental |")
    print("|---|---|---|---|")
    for dim in (100_000, 1_000_000):
        times = server_step_times(dim, args.repeats)
        print(f"| {dim:.0e} | {times['incremental']:.3f} | {times['naive']:.3f} | "
              f"{times['naive'] / times['incremental']:.1f}x |")
    print(f"\nLocal training of one client, I = 5 steps of batch 64 (median of {args.repeats})")
    print("| model | d | FedAvg (s) | GradMA-W (s) | GradMA-W / FedAvg |")
    print("|---|---|---|---|---|")
    for model_name, shape in (("mlp", (1, 28, 28)), ("lenet5", (3, 32, 32))):
        num_params, times = local_training_times(model_name, shape, args.repeats)
        print(f"| {model_name} | {num_params} | {times['fedavg']:.4f} | {times['gradma_w']:.4f} | "
              f"{times['gradma_w'] / times['fedavg']:.2f}x |")


if __name__ == "__main__":
    main()
