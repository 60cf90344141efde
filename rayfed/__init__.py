"""rayfed: a federated-learning simulator on Ray."""
from rayfed.api import Result, resume, run
from rayfed.config import Config, load_config
from rayfed.errors import ConfigError

__all__ = ["Config", "ConfigError", "Result", "load_config", "resume", "run"]
__version__ = "0.1.0"
