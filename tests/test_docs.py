"""The documentation site builds without a warning, and what the repository says cites papers,
never files outside it. What the reference shows is generated from the code: every capability with its
default, every field of the public dataclasses, every ClientTask attribute that algorithms read, the
files each dataset reads."""
import ast
import dataclasses
import inspect
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import rayfed
import rayfed.registry
from rayfed.algorithms.base import CAPABILITIES, Algorithm
from rayfed.algorithms.local_training import TrainingTask
from rayfed.errors import ConfigError

from tests.scripts import load_script

ROOT = Path(__file__).parents[1]
# A reference to the design notes beside the repository: a path into them, or a section of one of them.
OUTSIDE_REFERENCE = re.compile(r"specs/|\.\./shared|spec [a-z]+\.md|[a-z]+\.md §")


def test_the_site_builds_strictly(tmp_path):
    """Every link resolves and every generated reference page renders (mkdocs --strict fails on any warning)."""
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    for page in ("reference/config", "reference/cli", "reference/capabilities", "algorithms/gradma", "models",
                 "datasets"):
        assert (tmp_path / "site" / page / "index.html").exists(), page
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for field in ("rayfed.RoundInfo.sampled", "rayfed.Upload.num_samples", "rayfed.ClientTask.lr_factor",
                  "rayfed.Result.run_dir", "rayfed.Dataset.natural_partition"):
        assert f'id="{field}"' in api, field


def test_nothing_cites_files_outside_the_repository():
    files = [ROOT / "README.md", *(path for folder in ("rayfed", "docs") for path in (ROOT / folder).rglob("*")
                                   if path.suffix in (".py", ".md", ".yaml"))]
    cited = [f"{path.relative_to(ROOT)}:{number}" for path in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if OUTSIDE_REFERENCE.search(line)]
    assert not cited, cited


def test_the_readme_is_short_and_holds_the_two_set_up_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 8 * 1024
    assert "pip install -e . && rayfed run" in readme
    assert 'pip install -e ".[test]" && pytest' in readme


def test_the_nav_lists_each_registered_component_s_own_page(tmp_path):
    """A model's or dataset's page is listed by its registered name without an edit to mkdocs.yml; a page
    that names no registered component is not; every algorithm has one."""
    hook = _hook()
    for page in ("datasets/digits.md", "datasets/notes.md", "models/mlp.md"):
        (tmp_path / page).parent.mkdir(exist_ok=True)
        (tmp_path / page).write_text("# a page\n")
    nav = [{"Home": "index.md"}, {"Reference": [{"Algorithms": "algorithms/index.md"}, {"Models": "models/index.md"},
                                                {"Datasets": "datasets/index.md"}]}]
    reference = hook.on_config({"docs_dir": str(tmp_path), "nav": nav})["nav"][1]["Reference"]
    assert reference[1] == {"Models": ["models/index.md", {"mlp": "models/mlp.md"}]}
    assert reference[2] == {"Datasets": ["datasets/index.md", {"digits": "datasets/digits.md"}]}
    algorithms = reference[0]["Algorithms"]
    assert algorithms[0] == {"Overview": "algorithms/index.md"} and {"gradma": "algorithms/gradma.md"} in algorithms
    assert len(algorithms) == 1 + len(rayfed.registry.ALGORITHMS.names())
    with pytest.raises(ValueError, match="^mkdocs.yml's nav has no entry for models/index.md$"):
        hook.on_config({"docs_dir": str(tmp_path), "nav": [{"Algorithms": "algorithms/index.md"}]})


def _hook():
    return load_script(ROOT / "docs" / "hooks" / "reference.py", "reference_hook")


def _package():
    """rayfed as mkdocstrings reads it: griffe's static view, docstrings of attributes included."""
    import griffe
    return griffe.load("rayfed", search_paths=[str(ROOT)])


def test_the_capability_table_lists_every_capability_of_algorithm_with_its_default():
    declarations = {"Params", "state_classes"}
    attributes = {name: value for name, value in vars(Algorithm).items()
                  if not name.startswith("_") and name not in declarations
                  and not isinstance(value, (classmethod, staticmethod, property)) and not inspect.isfunction(value)}
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \| (.+) \|$", _hook().capabilities_page(), re.MULTILINE)
    assert {name: default for name, default, _ in rows} == {name: repr(value) for name, value in attributes.items()}
    assert set(CAPABILITIES) == set(attributes)
    assert all(meaning.strip() for _, _, meaning in rows)


def test_every_field_of_the_public_dataclasses_has_a_docstring():
    package = _package()
    undocumented = []
    for name in rayfed.__all__:
        exported = getattr(rayfed, name)
        if not dataclasses.is_dataclass(exported):
            continue
        members = package[name].final_target.members
        undocumented += [f"{name}.{field.name}" for field in dataclasses.fields(exported)
                         if field.name not in members or not members[field.name].docstring]
    assert not undocumented


def _read_on_client_tasks(paths) -> set[str]:
    """The attributes that functions read on a parameter annotated ClientTask."""
    read = set()
    for path in paths:
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            tasks = {argument.arg for argument in function.args.args + function.args.kwonlyargs
                     if argument.annotation is not None
                     and ast.unparse(argument.annotation) in ("ClientTask", "rayfed.ClientTask")}
            read |= {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)
                     and isinstance(node.value, ast.Name) and node.value.id in tasks}
    return read


def test_client_task_documents_what_algorithms_read_and_promises_only_what_the_engine_provides():
    protocol = _package()["ClientTask"].final_target.members
    documented = {name for name, member in protocol.items() if not name.startswith("_") and member.docstring}
    read = _read_on_client_tasks([*(ROOT / "rayfed" / "algorithms").glob("*.py"),
                                  *(ROOT / "examples").rglob("*.py")])
    assert {"num_samples", "steps", "lr_factor", "loss_and_grad"} <= read
    assert read <= documented
    # What a worker hands client_train: the client's task with the round's step count and decay.
    given = TrainingTask(SimpleNamespace(num_samples=7), steps=3, lr_factor=0.5)
    assert {name for name in protocol if not name.startswith("_")} <= set(dir(given))


def test_the_datasets_page_names_the_files_each_dataset_reads_under_data_root(tmp_path):
    """A dataset whose check of an empty data.root asks for files there declares them (required_files),
    and the generated page lists them; one that reads nothing there (generated, or a package's file) lists none."""
    section = _hook().datasets_section()
    for entry in rayfed.registry.DATASETS.entries():
        try:
            wanted = bool(entry.missing_files and entry.missing_files(str(tmp_path)))
        except ConfigError as error:
            wanted = str(tmp_path) in str(error)
        declared = entry.required_files(str(tmp_path)) if entry.required_files else []
        assert wanted == bool(declared), entry.name
        assert all(tmp_path in path.parents for path in declared), entry.name
        listed = re.search(rf"^### {entry.name}\n.*?^- files: ([^\n]*)$", section, re.MULTILINE | re.DOTALL).group(1)
        shown = entry.required_files("<data.root>") if declared else []
        assert listed == (", ".join(f"`{path.as_posix()}`" for path in shown) or "none under `data.root`"), entry.name
    assert "- files: `<data.root>/femnist/train`, `<data.root>/femnist/test`" in section


@pytest.mark.parametrize("page", ["README.md", "docs/reference/api.md", "docs/getting-started/quickstart.md"])
def test_the_first_python_example_needs_no_network(page):
    """Its config loads, and its dataset reads no files that data.download would fetch."""
    text = (ROOT / page).read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)
    path, overrides = re.search(r"load_config\((\"[^\"]+\"),\s*(\[[^\]]*\])\)", example).groups()
    config = rayfed.load_config(ROOT / ast.literal_eval(path), ast.literal_eval(overrides))
    assert not rayfed.data.required_files(config.data.dataset, config.data.root)
