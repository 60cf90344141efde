"""Model zoo and the flat-parameter adapter."""
from rayfed.models.flat import FlatModel
from rayfed.models.zoo import MODEL_NAMES, build_model

__all__ = ["FlatModel", "MODEL_NAMES", "build_model"]
