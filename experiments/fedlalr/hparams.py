"""Prints one method's hyper-parameters from FedLALR's paper (arXiv:2309.09719, Sec. V-A) as key=value overrides:

    rayfed run experiments/fedlalr/e2_cifar10_dir0.6.yaml $(python experiments/fedlalr/hparams.py cifar10 fedadam) seed=0

DATASET is cifar10, cifar100 or shakespeare; METHOD one of TABLE's keys.

TABLE has them for the paper's scenarios (e2_*, e3_*, e4_*, e5_*). [D]: not in the paper, chosen here
(carried over from CIFAR-10, or the default of LaFedOPT's reference code). Extras (not in the paper's six):
local_amsgrad takes FedLALR's values; fedyogi and fedadagrad take FedAdam's (FedAdagrad with
beta1 = 0, Reddi et al.'s default) [D].
"""
import sys

TABLE = {
    "cifar10": {
        "fedavg": {"algorithm.name": "fedavg", "algorithm.lr_local": 1.0},
        "fedadam": {"algorithm.name": "fedadam", "algorithm.lr_local": 0.1, "algorithm.lr_global": 1.0, "algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.tau": 0.01},
        "fedams_v1": {"algorithm.name": "fedams_v1", "algorithm.lr_local": 0.1, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.eps": 0.0001},
        "fedams_v2": {"algorithm.name": "fedams_v2", "algorithm.lr_local": 0.1, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.eps": 0.01},
        "lafedopt": {"algorithm.name": "lafedopt", "algorithm.lr_local": 0.0001, "algorithm.lr_global": 1.0, "algorithm.beta1": 0.8, "algorithm.beta2": 0.999, "algorithm.eps": 0.0001, "algorithm.correction": "joint"},  # server lr [D]
        "fedlalr": {"algorithm.name": "fedlalr", "algorithm.lr_local": 0.002, "algorithm.beta1": 0.9, "algorithm.beta2": 0.995, "algorithm.eps": 1e-08},
        "local_amsgrad": {"algorithm.name": "local_amsgrad", "algorithm.lr_local": 0.002, "algorithm.beta1": 0.9, "algorithm.beta2": 0.995, "algorithm.eps": 1e-08},
        "fedyogi": {"algorithm.name": "fedyogi", "algorithm.lr_local": 0.1, "algorithm.lr_global": 1.0, "algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.tau": 0.01},
        "fedadagrad": {"algorithm.name": "fedadagrad", "algorithm.lr_local": 0.1, "algorithm.lr_global": 1.0, "algorithm.beta1": 0.0, "algorithm.tau": 0.01},
    },
    "cifar100": {
        "fedavg": {"algorithm.name": "fedavg", "algorithm.lr_local": 2.0},
        "fedadam": {"algorithm.name": "fedadam", "algorithm.lr_local": 1.0, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.tau": 0.01},  # betas, tau [D]
        "fedams_v1": {"algorithm.name": "fedams_v1", "algorithm.lr_local": 1.0, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.eps": 0.0001},  # betas, eps [D]
        "fedams_v2": {"algorithm.name": "fedams_v2", "algorithm.lr_local": 1.0, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.eps": 0.01},  # betas, eps [D]
        "lafedopt": {"algorithm.name": "lafedopt", "algorithm.lr_local": 0.001, "algorithm.lr_global": 1.0, "algorithm.beta1": 0.9, "algorithm.beta2": 0.999, "algorithm.eps": 0.0001, "algorithm.correction": "joint"},  # server lr, eps [D]
        "fedlalr": {"algorithm.name": "fedlalr", "algorithm.lr_local": 0.002, "algorithm.beta1": 0.9, "algorithm.beta2": 0.995, "algorithm.eps": 1e-08},  # eps [D]
        "local_amsgrad": {"algorithm.name": "local_amsgrad", "algorithm.lr_local": 0.002, "algorithm.beta1": 0.9, "algorithm.beta2": 0.995, "algorithm.eps": 1e-08},
        "fedyogi": {"algorithm.name": "fedyogi", "algorithm.lr_local": 1.0, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.99, "algorithm.tau": 0.01},
        "fedadagrad": {"algorithm.name": "fedadagrad", "algorithm.lr_local": 1.0, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.0, "algorithm.tau": 0.01},
    },
    "shakespeare": {  # the same for the IID and non-IID splits
        "fedavg": {"algorithm.name": "fedavg", "algorithm.lr_local": 1.0},
        "fedadam": {"algorithm.name": "fedadam", "algorithm.lr_local": 0.1, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.998, "algorithm.tau": 0.01},  # tau [D]
        "fedams_v1": {"algorithm.name": "fedams_v1", "algorithm.lr_local": 0.1, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.998, "algorithm.eps": 0.0001},  # eps [D]
        "fedams_v2": {"algorithm.name": "fedams_v2", "algorithm.lr_local": 0.1, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.998, "algorithm.eps": 0.01},  # eps [D]
        "lafedopt": {"algorithm.name": "lafedopt", "algorithm.lr_local": 0.001, "algorithm.lr_global": 1.0, "algorithm.beta1": 0.5, "algorithm.beta2": 0.999, "algorithm.eps": 0.0001, "algorithm.correction": "joint"},  # server lr, eps [D]
        "fedlalr": {"algorithm.name": "fedlalr", "algorithm.lr_local": 0.05, "algorithm.beta1": 0.8, "algorithm.beta2": 0.998, "algorithm.eps": 1e-08},  # eps [D]
        "local_amsgrad": {"algorithm.name": "local_amsgrad", "algorithm.lr_local": 0.05, "algorithm.beta1": 0.8, "algorithm.beta2": 0.998, "algorithm.eps": 1e-08},
        "fedyogi": {"algorithm.name": "fedyogi", "algorithm.lr_local": 0.1, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.9, "algorithm.beta2": 0.998, "algorithm.tau": 0.01},
        "fedadagrad": {"algorithm.name": "fedadagrad", "algorithm.lr_local": 0.1, "algorithm.lr_global": 0.1, "algorithm.beta1": 0.0, "algorithm.tau": 0.01},
    },
}


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in TABLE or argv[1] not in TABLE[argv[0]]:
        sys.exit(f"usage: hparams.py DATASET METHOD; DATASET in {sorted(TABLE)}, METHOD in {sorted(TABLE['cifar10'])}")
    print(" ".join(f"{key}={value}" for key, value in TABLE[argv[0]][argv[1]].items()))


if __name__ == "__main__":
    main(sys.argv[1:])
