"""rayfed's version, apart from the package's other imports: a run's record reads it (rayfed.provenance)."""
__version__ = "0.1.0"
