"""MkDocs hook: the reference pages, generated from the code at build time so that they cannot go
stale: every config key from the pydantic schema, one page per registered algorithm, the algorithms'
capabilities with their defaults, the models with their parameter counts, the datasets with their
sources, and the CLI from its parsers.

A hand-written page at a generated page's path (docs/algorithms/NAME.md, docs/algorithms/index.md,
docs/datasets/index.md) is kept as the page's opening: the generated part follows it."""
from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import typing
from pathlib import Path

import yaml

from mkdocs.structure.files import File

import rayfed
from rayfed.algorithms.base import CAPABILITIES, Algorithm
from rayfed.algorithms.describe import capabilities, parameter_rows
from rayfed.cli import _parser
from rayfed.config import Config, DataConfig, ModelConfig
from rayfed.data.base import sample_count
from rayfed.fields import allowed_values
from rayfed.registry import ALGORITHMS, DATASETS, MODELS
from rayfed.resources import meta_model

SECTIONS = ("data", "model", "algorithm", "train", "systems", "engine", "selection", "compression", "aggregation",
            "adversary", "privacy", "logging")
# The models whose layers model.hidden_sizes sets.
WIDTH_MODELS = ("mlp", "relu_mlp")
# Markdown would read these in docstrings written as plain text (x_t, a * b, <v, M_j>) as markup.
_MARKUP = re.compile(r"([*_<\[\]])")


# The nav entries that the registries fill, each a folder of pages named by the registered names: every
# algorithm has a page (generated, with a hand-written opening where one exists); a model or a dataset is listed
# where it has a page of its own. So a component's page, a plugin's among them, needs no edit to mkdocs.yml.
REGISTRY_NAV = {"algorithms": ALGORITHMS, "models": MODELS, "datasets": DATASETS}


def on_config(config):
    """Lists the registered components' pages under their nav entries (mkdocs.yml names each folder's index)."""
    docs = Path(config["docs_dir"])
    for folder, registry in REGISTRY_NAV.items():
        names = [name for name in sorted(registry.names())
                 if registry is ALGORITHMS or (docs / folder / f"{name}.md").exists()]
        index = f"{folder}/index.md"
        opening = {"Overview": index} if registry is ALGORITHMS else index
        if not _expand(config["nav"], index, [opening, *({name: f"{folder}/{name}.md"} for name in names)]):
            raise ValueError(f"mkdocs.yml's nav has no entry for {index}")
    return config


def _expand(nav: list, index: str, pages: list) -> bool:
    """Replaces the nav entry whose value is `index` with `pages`."""
    for item in nav:
        if isinstance(item, dict):
            for title, value in item.items():
                if value == index:
                    item[title] = pages
                    return True
                if isinstance(value, list) and _expand(value, index, pages):
                    return True
    return False


def on_files(files, config):
    generated = {"reference/config.md": config_page(), "reference/cli.md": cli_page(),
                 "reference/capabilities.md": capabilities_page(), "models/index.md": models_page(),
                 "datasets/index.md": _opening(files, "datasets/index.md") + datasets_section(),
                 "algorithms/index.md": _opening(files, "algorithms/index.md") + algorithms_section()}
    for name in ALGORITHMS.names():
        path = f"algorithms/{name}.md"
        generated[path] = algorithm_page(name, _opening(files, path))
    for path, content in generated.items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=content))
    return files


def _opening(files, path: str) -> str:
    existing = files.get_file_from_path(path)
    return existing.content_string.rstrip() + "\n\n" if existing is not None else ""


def plain(text: str) -> str:
    """A docstring written as plain text, as Markdown that shows it as written: its `code` spans
    kept, markup characters outside them escaped, indented lines (formulas) as code blocks."""
    blocks, lines, in_code = [], inspect.cleandoc(text).splitlines(), False
    for line in lines:
        if line.startswith("    ") and line.strip():
            if not in_code:
                blocks += ["", "```text"]
                in_code = True
            blocks.append(line[4:])
            continue
        if in_code:
            blocks += ["```", ""]
            in_code = False
        parts = line.split("`")
        blocks.append("`".join(part if index % 2 else _MARKUP.sub(r"\\\1", part) for index, part in enumerate(parts)))
    if in_code:
        blocks.append("```")
    return "\n".join(blocks)


def one_line(text: str) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def yaml_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def default_of(field) -> object:
    return field.default_factory() if field.default_factory is not None else field.default


def type_of(field) -> tuple[str, str]:
    """A field's type in words and what it admits: ('int or null', '> 0 and at most 10000000')."""
    declared, nullable = field.annotation, False
    if typing.get_origin(declared) is typing.Union:
        arguments = [argument for argument in typing.get_args(declared) if argument is not type(None)]
        nullable = len(arguments) < len(typing.get_args(declared))
        declared = arguments[0] if len(arguments) == 1 else declared
    annotated = typing.Annotated[(declared, *field.metadata)] if field.metadata else declared
    admits = allowed_values(annotated)
    base = typing.get_args(declared)[0] if typing.get_origin(declared) is typing.Annotated else declared
    origin = typing.get_origin(base)
    if origin is typing.Literal:
        name = "str"
    elif origin is list:
        name = "list"
    elif origin is typing.Union:
        name = " or ".join(sorted({getattr(typing.get_origin(argument) or argument, "__name__", "value")
                                    for argument in typing.get_args(base)}))
    else:
        name = getattr(base, "__name__", str(base))
    return (f"{name} or null" if nullable else name), admits


# The config reference.

def config_page() -> str:
    lines = ["# Configuration keys", "",
             "Every key of a run's config, read from the pydantic schema (`rayfed/config.py`, and each algorithm's "
             "`Params` in `rayfed/algorithms/`). A config is the defaults below (the embedded quick-start), then a "
             "YAML file, then dotted `key=value` overrides: `rayfed run CONFIG.yaml train.rounds=10`. "
             "`rayfed config CONFIG.yaml` prints the resolved config. Values out of range fail before anything "
             "starts, with one line naming the key (exit code 2).", "",
             "## Top level", "", *_key_table(Config, "", skip=SECTIONS)]
    for section in SECTIONS:
        if section == "algorithm":
            lines += _algorithm_section()
            continue
        model = type(getattr(Config(), section))
        lines += ["", f"## {section}", "", one_line(model.__doc__), "", *_key_table(model, f"{section}.")]
    return "\n".join(lines) + "\n"


def _key_table(model, prefix: str, skip=()) -> list[str]:
    rows = ["| key | type | default | admits | meaning |", "|---|---|---|---|---|"]
    for key, field in model.model_fields.items():
        if key in skip:
            continue
        kind, admits = type_of(field)
        rows.append(f"| `{prefix}{key}` | {kind} | `{yaml_value(default_of(field))}` | {one_line(admits)} | "
                    f"{one_line(field.description)} |")
    return rows


def _algorithm_section() -> list[str]:
    common = rayfed.AlgorithmParams
    lines = ["", "## algorithm", "",
             "`algorithm.name` picks a registered algorithm; its `Params` declares the rest of the section. The "
             "keys every algorithm takes:", "", *_key_table(common, "algorithm.")]
    lines += ["", "An algorithm does not take `lr_global` when it has no server learning rate, nor `agg_weighting` "
              "when it weights its clients itself; setting a key an algorithm does not take is an error. Each "
              "algorithm's own keys, with their defaults for that algorithm:"]
    for name in sorted(ALGORITHMS.names()):
        own = [row for row in parameter_rows(name) if row[0] not in ("lr_local", "lr_global", "agg_weighting")]
        lines += ["", f"### {name}", "", f"[{name}](../algorithms/{name}.md): {one_line(ALGORITHMS.get(name).doc)}", ""]
        lines += _parameter_table(own, "algorithm.") if own else ["No keys of its own."]
    return lines


def _parameter_table(rows, prefix: str) -> list[str]:
    table = ["| key | default | admits | meaning |", "|---|---|---|---|"]
    table += [f"| `{prefix}{key}` | `{yaml_value(default)}` | {one_line(admits)} | {one_line(doc)} |"
              for key, default, admits, doc in rows]
    return table


# The algorithm pages.

def algorithms_section() -> str:
    lines = ["## Every registered algorithm", "",
             "Each page lists the algorithm's parameters and the capabilities it declares "
             "([what each allows](../reference/capabilities.md)).", "",
             "| name | what it is | upload / download (floats per client) |", "|---|---|---|"]
    for name in sorted(ALGORITHMS.names()):
        traffic = dict(capabilities(name))["upload"].replace(" per client; download:", " /").replace(
            " per client", "")
        lines.append(f"| [`{name}`]({name}.md) | {one_line(ALGORITHMS.get(name).doc)} | {traffic} |")
    return "\n".join(lines) + "\n"


def algorithm_page(name: str, opening: str) -> str:
    entry = ALGORITHMS.get(name)
    cls, module = entry.target, sys.modules[entry.module]
    lines = [opening.rstrip()] if opening else [f"# {name}", "", plain(cls.__doc__ or "")]
    if not opening and module.__doc__:
        lines += ["", f"From `{entry.module}`:", "", plain(module.__doc__)]
    lines += ["", "## Use", "", "```bash", f"rayfed run algorithm.name={name}", f"rayfed algorithms {name}",
              "```", "", "## Parameters", "",
              "The keys of the `algorithm:` section this algorithm takes (`algorithm.KEY=VALUE`):", "",
              *_parameter_table(parameter_rows(name), "")]
    lines += ["", "## Traffic, state and capabilities", "",
              "With the default parameters; d is the model's parameter count, N the number of clients. What each "
              "capability allows: [Algorithm capabilities](../reference/capabilities.md).", ""]
    lines += [f"- **{label}**: {value}" for label, value in capabilities(name)]
    for state in cls.state_classes:
        lines += ["", f"### `{state.__name__}`", "", "```python", inspect.getsource(state).rstrip(), "```"]
    source = Path(inspect.getsourcefile(cls)).relative_to(Path(rayfed.__file__).parents[1])
    lines += ["", f"Defined by `{cls.__name__}` in `{source.as_posix()}`."]
    return "\n".join(lines) + "\n"


def capabilities_page() -> str:
    lines = ["# Algorithm capabilities", "",
             "What a `rayfed.Algorithm` subclass declares besides its maths, as class attributes, read from "
             "`rayfed/algorithms/base.py` (the defaults from the class, the meanings from its `CAPABILITIES`). "
             "A default allows nothing the algorithm does not declare: one that declares none takes no "
             "`algorithm.lr_global` or `algorithm.agg_weighting`, and runs synchronous rounds only, uncompressed, "
             "neither vectorized nor from partial sums. A setting that needs an undeclared capability is refused "
             "before the run starts, in one line (`engine.vectorize` instead says why and trains the clients one "
             "after another). Each [algorithm's page](../algorithms/index.md) lists what it "
             "declares.", "",
             "| capability | default | what declaring it allows |", "|---|---|---|"]
    lines += [f"| `{name}` | `{getattr(Algorithm, name)!r}` | {one_line(meaning)} |"
              for name, meaning in CAPABILITIES.items()]
    lines += ["", "`keeps_client_state`, `vectorizable` and `sends_model` are read from the algorithm as built with "
              "the run's parameters, so its `__init__` may set them from those (GradMA-S trains stateless clients, "
              "FedGATE's `client_replicas` keeps the model at the clients); the others are read from the class.", "",
              "## Declaring them", "",
              "- **No server learning rate, or weights of its own**: leave `server_lr` or `weighted` False. The "
              "algorithm's section then has no `lr_global` or `agg_weighting` to set, and its page and "
              "`rayfed algorithms NAME` leave the key out.",
              "- **Partial sums** (`engine.partial_sums`): set `linear_uploads = True`, and in `server_step` read "
              "the uploads only as `rayfed.weighted_average(uploads, NAME, self.agg_weighting, round_info.weights)`. "
              "With partial sums, `uploads` is the workers' exact sums, which any other read refuses.",
              "- **Vectorized clients** (`engine.vectorize`): `vectorizable = True`, with a `client_train` that is "
              "`rayfed.local_sgd` (or `local_descent`) plus tensor operations that broadcast over a leading client "
              "dimension; client states through `rayfed.client_rows` and `rayfed.per_client`, and a local "
              "objective as [Local objectives](../tutorials/local-objectives.md#vectorised-clients) says.",
              "- **Asynchronous rounds**: `runs_async = True`, and `staleness_weighted = True` where an upload is a "
              "model change that `train.staleness_weight` may scale.",
              "- **Compression**: `compressed_upload = \"NAME\"` (the upload that is one model update) and "
              "`takes_compression = True`.", "",
              "[Your own algorithm, model and dataset](../tutorials/plugins.md) walks through a plugin that declares "
              "`server_lr`, `weighted`, `compressed_upload` and `takes_compression`."]
    return "\n".join(lines) + "\n"


# Models and datasets.

def models_page() -> str:
    hidden = tuple(ModelConfig().hidden_sizes)
    used = _models_in_use()
    lines = ["# Models", "",
             "Every registered model (`model.name`), with its parameter count d on the datasets it is used with: "
             "as a dataset's default model (`model.name=auto`) or in a config under `experiments/`. Counts are "
             "of the model as a run builds it (`rayfed.models.build_model`), with the config's "
             f"`model.hidden_sizes` for the models that read it (default {list(hidden)}).", ""]
    for entry in MODELS.entries():
        lines += [f"## {entry.name}", "", plain(entry.doc), ""]
        if (Path(__file__).parents[1] / "models" / f"{entry.name}.md").exists():
            lines += [f"More on its own page: [{entry.name}]({entry.name}.md).", ""]
        defaults = [dataset.name for dataset in DATASETS.entries() if dataset.default_model == entry.name]
        if defaults:
            lines += ["The default model of: " + ", ".join(f"`{name}`" for name in defaults) + ".", ""]
        rows = []
        for dataset, sizes in sorted(used.get(entry.name, {}).items()):
            shape = DATASETS.get(dataset)
            for widths in sorted(sizes or {hidden}):
                count = sum(parameter.numel() for parameter in meta_model(entry.name, dataset, widths).parameters())
                shown = str(list(widths)) if entry.name in WIDTH_MODELS else ""
                rows.append(f"| `{dataset}` | {'x'.join(map(str, shape.input_shape))} | {shape.num_classes} | "
                            f"{shown} | {count:,} |")
        lines += (["| dataset | input | classes | hidden sizes | d |", "|---|---|---|---|---|", *rows] if rows
                  else ["Neither a dataset's default model nor used by a config under `experiments/`."])
        lines.append("")
    return "\n".join(lines)


def _models_in_use() -> dict[str, dict[str, set]]:
    """model -> dataset -> the hidden sizes it is used with: each dataset's default model, and the
    (model, dataset) pairs that the run configs under experiments/ name (sweep files aside)."""
    used: dict[str, dict[str, set]] = {}
    for dataset in DATASETS.entries():
        used.setdefault(dataset.default_model, {}).setdefault(dataset.name, set())
    for path in sorted((Path(__file__).parents[2] / "experiments").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or "grid" in raw:
            continue
        data, model = raw.get("data") or {}, raw.get("model") or {}
        dataset = data.get("dataset", DataConfig().dataset)
        if dataset not in DATASETS:
            continue
        name = model.get("name", "auto")
        name = DATASETS.get(dataset).default_model if name == "auto" else name
        widths = used.setdefault(name, {}).setdefault(dataset, set())
        if name in WIDTH_MODELS:
            widths.add(tuple(model.get("hidden_sizes", ModelConfig().hidden_sizes)))
    return used


def datasets_section() -> str:
    data = DataConfig()
    lines = ["## Every registered dataset", "",
             "Read from each dataset's registration (`rayfed.register_dataset`); samples are train + test with "
             "the default `data.*` keys; files are what it reads under `data.root` (files, or folders of them).", ""]
    for entry in DATASETS.entries():
        files = entry.required_files("<data.root>") if entry.required_files else []
        module = sys.modules[entry.target.__module__]
        source = entry.doc or one_line((module.__doc__ or "").split("\n\n")[0])
        lines += [f"### {entry.name}", "", plain(source), "",
                  f"- inputs {'x'.join(map(str, entry.input_shape))}, {entry.num_classes} classes, "
                  f"{sample_count(entry.name, data):,} samples; default model `{entry.default_model}`"
                  + ("; its own clients (`data.partition=natural`)" if entry.natural else ""),
                  "- files: " + (", ".join(f"`{Path(path).as_posix()}`" for path in files) if files
                                 else "none under `data.root`"),
                  f"- loader: `{entry.target.__module__}`", ""]
    return "\n".join(lines)


# The CLI.

def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "." if text else ""


def cli_page() -> str:
    parser = _parser()
    lines = ["# Command line", "", f"`{parser.prog}`: {parser.description} `python -m rayfed` runs the same CLI.",
             "Generated from its argument parsers (`rayfed/cli.py`); `rayfed COMMAND --help` prints the same.",
             "Exit codes: 0 done; 2 a bad config or argument, before any work (one line on stderr); 1 a run that "
             "could not go on, or a sweep with failed trials; 130 or 143 after Ctrl-C or SIGTERM."]
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    for name, sub in commands.choices.items():
        lines += ["", f"## rayfed {name}", "", _sentence(helps.get(name) or ""),
                  "", "```text", sub.format_usage().strip(), "```", "",
                  "| argument | meaning | default |", "|---|---|---|"]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = ", ".join(action.option_strings) or (action.metavar or action.dest)
            if action.option_strings and action.nargs != 0:
                names += f" {action.metavar or action.dest.upper()}"
            default = "" if action.default in (None, False, argparse.SUPPRESS) or not action.option_strings \
                else f"`{yaml_value(action.default)}`"
            meaning = one_line(action.help)
            if action.choices and action.option_strings:
                meaning += f" (one of: {', '.join(map(str, action.choices))})"
            lines.append(f"| `{names}` | {meaning} | {default} |")
    return "\n".join(lines) + "\n"
