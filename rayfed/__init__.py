"""rayfed: a federated-learning simulator on Ray.

Components of your own register with the decorators below, in a module of yours, and are then
used by name in a config like the built-ins (which register the same way): import the module
before `rayfed.run`, or name it in the config's `plugins:` list. Callbacks (rayfed.Callback) see a
run's rounds from the driver, and may stop it."""
from rayfed.algorithms import (Algorithm, AlgorithmContext, AlgorithmParams, ClientTask, RoundInfo, RunFacts, Upload,
                               register_algorithm)
from rayfed.algorithms.base import ClientStates, client_rows, local_descent, local_sgd, per_client, weighted_average
from rayfed.algorithms.objective import Linear, LocalObjective, Proximal
from rayfed.adversary import Attack, register_attack
from rayfed.aggregation import register_rule
from rayfed.api import Result, release_actors, resume, run
from rayfed.callbacks import Callback, RunView, Stop, register_callback
from rayfed.compression import register_compressor
from rayfed.config import Config
from rayfed.preflight import load_config
from rayfed.privacy import Mechanism, register_mechanism
from rayfed.data import Dataset, Partition, PartitionRequest, register_dataset, register_partitioner
from rayfed.errors import ConfigError, RunFinished, RunStopped
from rayfed.models import ModelForward, register_model, with_structure
from rayfed.selection import Selection, SelectionRequest, register_selector
from rayfed import version

__all__ = ["Algorithm", "AlgorithmContext", "AlgorithmParams", "Attack", "Callback", "ClientStates", "ClientTask",
           "Config", "ConfigError", "Dataset", "Linear", "LocalObjective", "Mechanism", "ModelForward", "Partition",
           "PartitionRequest", "Proximal", "Result", "RoundInfo", "RunFacts", "RunFinished", "RunStopped", "RunView",
           "Selection", "SelectionRequest", "Stop", "Upload", "client_rows", "load_config", "local_descent",
           "local_sgd", "per_client", "register_algorithm", "register_attack", "register_callback",
           "register_compressor", "register_dataset", "register_mechanism", "register_model", "register_partitioner",
           "register_rule", "register_selector", "release_actors", "resume", "run", "weighted_average", "with_structure"]
__version__ = version.__version__
