"""Federated optimisation algorithms as pure maths on flat parameter vectors (no Ray)."""
from rayfed.algorithms.base import Algorithm, ClientTask, RoundInfo, Upload
from rayfed.algorithms.registry import ALGORITHMS, build_algorithm

__all__ = ["Algorithm", "ClientTask", "RoundInfo", "Upload", "ALGORITHMS", "build_algorithm"]
