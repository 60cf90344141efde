"""Model zoo and the flat-parameter adapter. Each module registers its models
(rayfed.register_model); importing the package imports them all."""
from rayfed.models.flat import FlatModel
from rayfed.models.forward import ModelForward, with_structure
from rayfed.models.zoo import build_model, register_model
from rayfed.registry import import_submodules

import_submodules(__name__, __path__)

__all__ = ["FlatModel", "ModelForward", "build_model", "register_model", "with_structure"]
