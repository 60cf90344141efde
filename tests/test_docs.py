"""The documentation site builds without a warning, and what the repository says cites papers,
never files outside it."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rayfed.registry

ROOT = Path(__file__).parents[1]
# A reference to the design notes beside the repository: a path into them, or a section of one of them.
OUTSIDE_REFERENCE = re.compile(r"specs/|\.\./shared|spec [a-z]+\.md|[a-z]+\.md §")


def test_the_site_builds_strictly(tmp_path):
    """Every link resolves and every generated reference page renders (mkdocs --strict fails on any warning)."""
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    for page in ("reference/config", "reference/cli", "algorithms/gradma", "models", "datasets"):
        assert (tmp_path / "site" / page / "index.html").exists(), page


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
    spec = importlib.util.spec_from_file_location("reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
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
