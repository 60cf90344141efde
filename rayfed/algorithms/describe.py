"""`rayfed algorithms [NAME]`: the registered algorithms, and one algorithm's parameters (defaults,
ranges, one line each) and capabilities, read from its declaration."""
from __future__ import annotations

import typing

from rayfed.algorithms.base import FLOAT32_BYTES, build_algorithm
from rayfed.fields import allowed_values
from rayfed.registry import ALGORITHMS


def list_algorithms() -> str:
    width = max(map(len, ALGORITHMS.names()))
    return "".join(f"{entry.name:<{width}}  {entry.doc}\n" for entry in ALGORITHMS.entries())


def describe_algorithm(name: str) -> str:
    entry = ALGORITHMS.get(name)
    cls = entry.target
    params = cls.Params
    lines = [f"{name}: {entry.doc}", f"  defined in {entry.module}", "", "parameters (algorithm.KEY=VALUE):"]
    rows = []
    for key, field in params.model_fields.items():
        if key == "name" or (key == "lr_global" and not cls.server_lr) or (key == "agg_weighting" and not cls.weighted):
            continue
        declared = typing.get_type_hints(params, include_extras=True)[key]
        admits = allowed_values(typing.Annotated[(declared, *field.metadata)] if field.metadata else declared)
        rows.append((key, repr(field.default), admits, field.description or ""))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines += [f"  {key:<{widths[0]}}  {default:<{widths[1]}}  {admits:<{widths[2]}}  {doc}".rstrip()
              for key, default, admits, doc in rows]
    algorithm = build_algorithm(params(name=name))
    client_floats = algorithm.memory_bytes(1, 1, 1).get("client states", 0) // FLOAT32_BYTES
    lines += ["", "capabilities (with the default parameters; d: the model's parameters, N: the clients):",
              f"  upload: {algorithm.upload_size(1)} x d floats per client; download: "
              f"{algorithm.download_size(1)} x d floats per client",
              f"  client state: {f'{client_floats} x d floats per client' if client_floats else 'none kept'}",
              f"  compression: {_takes_compression(algorithm)}",
              f"  train.round_policy=async_buffered: {'yes' if cls.runs_async and not cls.averages_models else 'no'}",
              f"  engine.vectorize: {'yes' if algorithm.vectorizable else 'no'}",
              f"  server reply after each round: {'yes' if algorithm.replies else 'no'}",
              f"  model: {MODEL_NEEDS[cls.model_needs]}",
              f"  state classes: {', '.join(state.__name__ for state in cls.state_classes) or 'none'}"]
    return "\n".join(lines) + "\n"


MODEL_NEEDS = {None: "any", "features": "one whose representation it can take (an nn.Sequential)",
               "blocks": "one that declares two or more blocks (rayfed.models.forward.with_structure)"}


def _takes_compression(algorithm) -> str:
    if algorithm.compressed_upload and algorithm.takes_compression:
        return f"yes, of its upload {algorithm.compressed_upload!r}"
    return "no"
