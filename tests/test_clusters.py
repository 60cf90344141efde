"""The cluster files install what rayfed needs to run, pinned: every runtime dependency of
pyproject.toml, at one exact version that satisfies pyproject's specifier, the same in every file;
Ray's version is the images' and the same everywhere."""
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "clusters"
IMAGE = re.compile(r"rayproject/ray:(\d+\.\d+\.\d+)(-py\d+)?(-gpu)?")


def runtime_dependencies() -> dict[str, Requirement]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {canonicalize_name(requirement.name): requirement for requirement in map(Requirement, dependencies)}


def pins(lines) -> dict[str, Version]:
    """name -> the version it is pinned to; a requirement that is not pinned to one version fails."""
    pinned = {}
    for line in lines:
        requirement = Requirement(line)
        operators = [(spec.operator, spec.version) for spec in requirement.specifier]
        assert len(operators) == 1 and operators[0][0] == "==", f"{line} is not pinned to one version"
        pinned[canonicalize_name(requirement.name)] = Version(operators[0][1])
    return pinned


def requirements_file() -> dict[str, Version]:
    lines = (CLUSTERS / "requirements.txt").read_text().splitlines()
    return pins(line for line in lines if line.strip() and not line.startswith("#"))


def rayjob_runtime_env() -> dict[str, Version]:
    documents = list(yaml.safe_load_all((CLUSTERS / "kuberay" / "rayjob.yaml").read_text()))
    job, = [document for document in documents if document["kind"] == "RayJob"]
    return pins(yaml.safe_load(job["spec"]["runtimeEnvYAML"])["pip"])


def aws_setup() -> dict[str, Version]:
    commands = yaml.safe_load((CLUSTERS / "aws.yaml").read_text())["setup_commands"]
    install, = [shlex.split(command) for command in commands if command.startswith("pip install")]
    return pins(install[2:])


def image_ray_versions(path: Path) -> set[Version]:
    text = path.read_text()
    versions = {Version(match.group(1)) for match in IMAGE.finditer(text)}
    versions |= {Version(version) for version in re.findall(r'rayVersion: "([^"]+)"', text)}
    images = re.findall(r'image: "?([^"\s]+)', text)
    assert images and all(IMAGE.fullmatch(image) for image in images), images
    return versions


def check(pinned: dict[str, Version], where: str, provided: set[str] = frozenset()) -> None:
    required = runtime_dependencies()
    missing = set(required) - set(pinned) - provided
    assert not missing, f"{where} does not install {sorted(missing)}"
    for name, version in pinned.items():
        assert name in required, f"{where} installs {name}, which is no runtime dependency of pyproject.toml"
        assert required[name].specifier.contains(version), f"{where}: {name}=={version} is not {required[name]}"


@pytest.mark.parametrize("where, read, provided", [
    ("clusters/requirements.txt", requirements_file, {"ray"}),
    ("clusters/kuberay/rayjob.yaml runtimeEnvYAML pip", rayjob_runtime_env, {"ray"}),
    ("clusters/aws.yaml setup_commands", aws_setup, set()),
])
def test_every_runtime_dependency_is_pinned_to_a_version_pyproject_allows(where, read, provided):
    check(read(), where, provided)


def test_every_file_pins_the_same_versions_and_ray_is_the_images():
    files = [requirements_file(), rayjob_runtime_env(), aws_setup()]
    ray_versions = set().union(*(image_ray_versions(path) for path in
                                 (CLUSTERS / "kuberay" / "rayjob.yaml", CLUSTERS / "kuberay" / "raycluster.yaml",
                                  CLUSTERS / "aws.yaml")))
    assert len(ray_versions) == 1 and ray_versions == {files[2]["ray"]}
    assert runtime_dependencies()["ray"].specifier.contains(ray_versions.pop())
    assert files[0] == files[1] == {name: version for name, version in files[2].items() if name != "ray"}


def test_submit_pip_ships_the_requirements_file(tmp_path):
    """`submit.sh --pip` hands Ray the pins, as the runtime env a fake `ray job submit` receives."""
    (tmp_path / "ray").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (tmp_path / "ray").chmod(0o755)
    environment = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    result = subprocess.run([str(CLUSTERS / "submit.sh"), "--pip", str(ROOT / "experiments/gradma/digits.yaml")],
                            capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stderr
    arguments = result.stdout.splitlines()
    runtime_env = json.loads(arguments[arguments.index("--runtime-env-json") + 1])
    assert Path(runtime_env["pip"]) == CLUSTERS / "requirements.txt"
