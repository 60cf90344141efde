"""`rayfed algorithms [NAME]`: the registered algorithms, and one algorithm's parameters (defaults,
ranges, one line each) and capabilities, read from its declaration."""
from __future__ import annotations

import typing
from typing import Any

from rayfed.algorithms.base import FLOAT32_BYTES, build_algorithm
from rayfed.fields import allowed_values
from rayfed.registry import ALGORITHMS


def list_algorithms() -> str:
    width = max(map(len, ALGORITHMS.names()))
    return "".join(f"{entry.name:<{width}}  {entry.doc}\n" for entry in ALGORITHMS.entries())


def describe_algorithm(name: str) -> str:
    entry = ALGORITHMS.get(name)
    lines = [f"{name}: {entry.doc}", f"  defined in {entry.module}", "", "parameters (algorithm.KEY=VALUE):"]
    rows = [(key, repr(default), admits, doc) for key, default, admits, doc in parameter_rows(name)]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines += [f"  {key:<{widths[0]}}  {default:<{widths[1]}}  {admits:<{widths[2]}}  {doc}".rstrip()
              for key, default, admits, doc in rows]
    lines += ["", "capabilities (with the default parameters; d: the model's parameters, N: the clients):"]
    lines += [f"  {label}: {value}" for label, value in capabilities(name)]
    return "\n".join(lines) + "\n"


def parameter_rows(name: str) -> list[tuple[str, Any, str, str]]:
    """The keys an algorithm takes (the common ones it uses, then its own): key, default, what the
    type admits in words, description. The documentation's algorithm pages show the same rows."""
    cls = ALGORITHMS.get(name).target
    params = cls.Params
    hints = typing.get_type_hints(params, include_extras=True)
    rows = []
    for key, field in params.model_fields.items():
        if key == "name" or (key == "lr_global" and not cls.server_lr) or (key == "agg_weighting" and not cls.weighted):
            continue
        declared = hints[key]
        admits = allowed_values(typing.Annotated[(declared, *field.metadata)] if field.metadata else declared)
        rows.append((key, field.default, admits, field.description or ""))
    return rows


def capabilities(name: str) -> list[tuple[str, str]]:
    """What an algorithm sends, keeps and works with, read from an instance with the default parameters."""
    cls = ALGORITHMS.get(name).target
    algorithm = build_algorithm(cls.Params(name=name))
    client_floats = algorithm.memory_bytes(1, 1, 1).get("client states", 0) // FLOAT32_BYTES
    return [("upload", f"{algorithm.upload_size(1)} x d floats per client; download: "
                       f"{algorithm.download_size(1)} x d floats per client"),
            ("client state", f"{client_floats} x d floats per client" if client_floats else "none kept"),
            ("compression", _takes_compression(algorithm)),
            ("train.round_policy=async_buffered", "yes" if cls.runs_async and not cls.averages_models else "no"),
            ("engine.vectorize", "yes" if algorithm.vectorizable else "no"),
            ("engine.partial_sums", "yes" if cls.linear_uploads else "no"),
            ("server reply after each round", "yes" if algorithm.replies else "no"),
            ("model", MODEL_NEEDS[cls.model_needs]),
            ("state classes", ", ".join(state.__name__ for state in cls.state_classes) or "none")]


MODEL_NEEDS = {None: "any", "features": "one whose representation it can take (an nn.Sequential)",
               "blocks": "one that declares two or more blocks (rayfed.models.forward.with_structure)"}


def _takes_compression(algorithm) -> str:
    if algorithm.compressed_upload and algorithm.takes_compression:
        return f"yes, of its upload {algorithm.compressed_upload!r}"
    return "no"
