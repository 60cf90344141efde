"""Federated optimisation algorithms as pure maths on flat parameter vectors (no Ray). Each module
registers its algorithms (rayfed.register_algorithm); importing the package imports them all."""
from rayfed.algorithms.base import (Algorithm, AlgorithmContext, ClientTask, RoundInfo, Upload, build_algorithm,
                                    register_algorithm)
from rayfed.algorithms.params import AlgorithmParams, RunFacts
from rayfed.registry import import_submodules

import_submodules(__name__, __path__)

__all__ = ["Algorithm", "AlgorithmContext", "AlgorithmParams", "ClientTask", "RoundInfo", "RunFacts", "Upload",
           "build_algorithm", "register_algorithm"]
