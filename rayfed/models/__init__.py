"""Model zoo and the flat-parameter adapter."""
from rayfed.models.flat import FlatModel
from rayfed.models.zoo import build_model, register_model

__all__ = ["FlatModel", "build_model", "register_model"]
