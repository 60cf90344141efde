"""The benchmark workloads: each is a config (overrides of the quick-start defaults) that both
rayfed and the plain loop run. Evaluation happens once, after the last round, so a round's time
is training and aggregation alone."""
from __future__ import annotations

from rayfed.config import Config
from rayfed.preflight import load_config
from rayfed.errors import ConfigError

# Synthetic clients of 50-64 samples: 100k of them fit in memory, and every client still fills
# a batch of 32, so `tiny`, `huge_n` and `million` do the same work per round.
_TINY = ["data.dataset=synthetic", "data.synthetic_max_samples=64", "model.name=logreg",
         "train.clients_per_round=100", "train.local_steps=5", "train.batch_size=32"]

WORKLOADS = {
    "tiny": ["data.num_clients=1000", *_TINY],
    "lenet": ["data.dataset=cifar10_random", "data.partition=iid", "data.num_clients=100", "model.name=lenet5",
              "train.clients_per_round=10", "train.local_steps=5", "train.batch_size=64"],
    "huge_n": ["data.num_clients=100000", *_TINY],
    "million": [*_TINY, "data.dataset=synthetic_lazy", "data.num_clients=1000000"],
}
DESCRIPTIONS = {
    "tiny": "Synthetic, logreg, N=1000, S=100, 5 steps of batch 32 (overhead-bound)",
    "lenet": "LeNet-5 on CIFAR-10-shaped random tensors, N=100, S=10, 5 steps of batch 64 (compute-bound)",
    "huge_n": "as tiny with N=100000 (cost should follow S, not N)",
    "million": "as tiny with N=1000000 clients made on demand (synthetic_lazy): memory and start-up should follow S",
    # Run only when named (rayfed.bench.study): a sweep, timed for its start-up rather than its rounds.
    "study": "rayfed sweep of 8 trials of tiny with N=100, S=10, 2 rounds: Ray's start, the trial processes' start, "
             "start-up per trial",
}


# What an override may change: the plain loop is FedAvg with every client always online, so
# anything else (another algorithm, availability, round policies) would time two different programs.
OVERRIDABLE = ("seed", "data.", "model.", "algorithm.lr_local", "algorithm.lr_global", "train.clients_per_round",
               "train.local_steps", "train.batch_size", "engine.")


def workload_config(name: str, rounds: int, overrides: list[str] = ()) -> Config:
    """FedAvg on workload `name` for `rounds` rounds, evaluated after the last one."""
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    for override in overrides:
        key = override.split("=", 1)[0]
        if not any(key == allowed or (allowed.endswith(".") and key.startswith(allowed)) for allowed in OVERRIDABLE):
            raise ConfigError(f"bench: {key} cannot be overridden: the plain loop it is timed against is FedAvg "
                              f"with every client online (overridable: {', '.join(OVERRIDABLE)})")
    return load_config(None, ["algorithm.name=fedavg", "algorithm.lr_local=0.05", *WORKLOADS[name], *overrides,
                              f"train.rounds={rounds}", f"train.eval_every={rounds}"])
