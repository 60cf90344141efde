"""rayfed: a federated-learning simulator on Ray."""
from rayfed.api import Result, resume, run
from rayfed.config import Config, load_config
from rayfed.errors import ConfigError, RunFinished, RunStopped

__all__ = ["Config", "ConfigError", "Result", "RunFinished", "RunStopped", "load_config", "resume", "run"]
__version__ = "0.1.0"
