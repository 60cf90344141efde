"""One copy of the training arrays per GPU (rayfed.engine.gpu_share). The CUDA IPC itself needs a GPU, which CI has
not: it was verified on an H200 (experiments/scaling/README.md, GPU); here, which worker on each
GPU is grouped with whom."""
import torch

from rayfed.engine.gpu_share import gpu_identity, sharing_groups


def test_the_first_worker_on_each_shared_gpu_exports_and_workers_alone_or_on_the_cpu_do_not_share():
    identities = ["gpu-a", "gpu-b", "gpu-a", None, "gpu-a", "gpu-c", "gpu-b"]
    assert sharing_groups(identities) == [[0, 2, 4], [1, 6]]
    assert sharing_groups([None, None]) == []
    assert sharing_groups(["gpu-a"]) == []
    assert gpu_identity(torch.device("cpu")) is None
