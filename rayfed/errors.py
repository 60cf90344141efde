"""The one exception type for bad user input."""


class ConfigError(ValueError):
    """Bad input (config key, value, file): reported as one line, exit code 2, before any work."""
