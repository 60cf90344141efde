"""What decides a run's bits besides its config: the libraries and the kernels they chose on the processor.

A run records it (`environment`, a flat dict of strings) in summary.json and in every checkpoint,
and a resume compares the fields of DECIDING with the checkpoint's. For the ray engine each process
that computes (the server, every worker) reports its own once at the start; a field on which they
differ holds each value with the processes that have it.

PyTorch picks its CPU kernels by the processor's instruction set (ATen's CPU capability), and MKL
and oneDNN pick their code paths by it too, so processors of different kinds give different bits.
engine.cpu_isa caps all three at one instruction set through the three variables of CAPS, which
each library reads from the environment at its first computation in a process, never again.
"""
from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from pathlib import Path

import numpy as np
import torch

from rayfed.config import CPU_ISAS
from rayfed.errors import ConfigError
from rayfed.version import __version__

# The variables that cap PyTorch's kernels, MKL's code branch (its Conditional Numerical Reproducibility
# mode) and oneDNN's instruction set at each of CPU_ISAS: `default` is what any x86-64 processor runs.
CAPS = {"default": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"},
        "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
        "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
# The fields whose change may change the bits: a resume where one differs from the checkpoint's is refused
# unless accepted. `mkl` and `onednn` name the cap in force, or the processor whose best path they take.
DECIDING = ("torch", "torch_cuda", "numpy", "cpu_capability", "mkl", "onednn", "threads", "gpu", "cudnn")
# Recorded to explain the others, not compared: the caps in the environment, the processor (its model
# and best capability), the OpenBLAS kernels numpy's and cvxopt's libraries chose, Python's version,
# and rayfed's own code (a resume with a newer rayfed is allowed: its algorithms' bits are tested).
INFORMATIVE = ("cpu_caps", "processor", "openblas", "python", "rayfed")
_MKL_VERSION = re.compile(r"Math Kernel Library Version (.+?) for")
_ONEDNN_VERSION = re.compile(r"(?:MKL-DNN|oneDNN) v(\S+)")


def environment() -> dict[str, str]:
    """This process's record (DECIDING, then INFORMATIVE): taken once it computes as the run will,
    its torch thread count set and its GPU, if any, in use."""
    built = torch.__config__.show()
    processor = _processor()
    on_gpu = torch.cuda.is_initialized()
    return {
        "torch": str(torch.__version__),
        "torch_cuda": torch.version.cuda or "none",
        "numpy": np.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": _library_path(_MKL_VERSION.search(built), torch.backends.mkl.is_available(), "MKL_CBWR", processor),
        "onednn": _library_path(_ONEDNN_VERSION.search(built), torch.backends.mkldnn.is_available(),
                                "ONEDNN_MAX_CPU_ISA", processor),
        "threads": str(torch.get_num_threads()),
        "gpu": torch.cuda.get_device_name() if on_gpu else "none",
        "cudnn": str(torch.backends.cudnn.version()) if on_gpu and torch.backends.cudnn.is_available() else "none",
        "cpu_caps": " ".join(f"{name}={os.environ[name]}" for name in CAPS["default"] if name in os.environ) or "none",
        "processor": processor,
        "openblas": _openblas(),
        "python": platform.python_version(),
        "rayfed": rayfed_code(),
    }


@functools.cache
def rayfed_code() -> str:
    """rayfed's version, and where it runs from a git checkout its commit, with `+changes` where tracked
    files differ from it: a study's results name the code that made them."""
    package = Path(__file__).parent
    try:
        # Tracked there: a package installed into a virtual environment inside some other checkout is not its code.
        if not _git(package, "ls-files", "--", "__init__.py"):
            return __version__
        commit = _git(package, "rev-parse", "--short=12", "HEAD")
        changed = _git(package, "status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return __version__          # installed from a wheel, or no git on this node
    return f"{__version__} (git {commit}{' +changes' if changed else ''})"


def _git(folder: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True, text=True, check=True,
                          timeout=10).stdout.strip()


def merged(server: dict[str, str], workers: list[dict[str, str]]) -> dict[str, str]:
    """One record for a run's processes: a field they share as it is; one they do not as each value
    with the processes that have it, the most common first: `AVX512 (server, workers 0-2); AVX2 (worker 3)`."""
    fields = dict.fromkeys([*server, *(name for record in workers for name in record)])
    record = {}
    for name in fields:
        holders: dict[str, list] = {}
        holders.setdefault(server.get(name, "none"), []).append("server")
        for index, worker in enumerate(workers):
            holders.setdefault(worker.get(name, "none"), []).append(index)
        if len(holders) == 1:
            record[name] = next(iter(holders))
        else:
            ranked = sorted(holders.items(), key=lambda item: -len(item[1]))
            record[name] = "; ".join(f"{value} ({_processes(who)})" for value, who in ranked)
    return record


def first_difference(recorded: dict[str, str], current: dict[str, str]) -> tuple[str, str, str] | None:
    """(field, recorded value, current value) of the first field of DECIDING that both hold and that differs."""
    return next(((name, recorded[name], current[name]) for name in DECIDING
                 if name in recorded and name in current and recorded[name] != current[name]), None)


def check_driver_cpu_isa(isa: str | None) -> None:
    """engine.cpu_isa in the driver: the caps in its environment, and PyTorch's kernels those of `isa`.
    PyTorch, MKL and oneDNN read the caps at their first computation, which a config's checks already
    made, so they must be in the environment from the process's start; `rayfed run` starts itself
    again with them when they are not. ConfigError of one line otherwise."""
    if isa is None:
        return
    check_processor(isa, "this machine")
    shown = " ".join(f"{name}={value}" for name, value in CAPS[isa].items())
    if any(os.environ.get(name) != value for name, value in CAPS[isa].items()):
        raise ConfigError(f"engine.cpu_isa={isa} needs {shown} in the environment from the process's start (PyTorch, "
                          f"MKL and oneDNN read them at their first computation): set them before starting Python, or "
                          f"use `rayfed run`, which does")
    chosen = torch.backends.cpu.get_cpu_capability()
    if chosen.lower() != isa:
        raise ConfigError(f"engine.cpu_isa={isa}: this process computes with PyTorch's {chosen} kernels, chosen at its "
                          f"first computation, before {shown} was in its environment: set them before starting "
                          f"Python, or use `rayfed run`")


def check_actor_cpu_isa(isa: str | None, actor: str) -> None:
    """engine.cpu_isa in a Ray actor, which its runtime environment gave the caps: its processor has
    the instruction set, and PyTorch's kernels are those of `isa`. ConfigError naming `actor` otherwise."""
    if isa is None:
        return
    check_processor(isa, f"{actor}'s node")
    chosen = torch.backends.cpu.get_cpu_capability()
    if chosen.lower() != isa:
        raise ConfigError(f"engine.cpu_isa={isa}: {actor} computes with PyTorch's {chosen} kernels: its process did "
                          f"not start with ATEN_CPU_CAPABILITY={CAPS[isa]['ATEN_CPU_CAPABILITY']}")


def processor_isa() -> str | None:
    """The highest of CPU_ISAS this processor runs (ATen's own test: AVX-512 F/VL/BW/DQ with FMA, or
    AVX2 with FMA), None when it is not an x86 processor."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    features = _cpu_features()
    if features.get("FMA3") and all(features.get(f"AVX512{part}") for part in ("F", "VL", "BW", "DQ")):
        return "avx512"
    return "avx2" if features.get("FMA3") and features.get("AVX2") else "default"


def check_processor(isa: str, where: str) -> None:
    """A ConfigError of one line where this processor cannot run `isa` (ATen would take the cap as
    it is, and its kernels would stop the process at their first instruction the processor lacks)."""
    best = processor_isa()
    if best is None:
        raise ConfigError(f"engine.cpu_isa={isa} caps x86 kernels, but {where} has a {platform.machine()} processor")
    if CPU_ISAS.index(isa) > CPU_ISAS.index(best):
        raise ConfigError(f"engine.cpu_isa={isa}: {where} has a processor without it (its best is {best}); choose "
                          f"an instruction set every node has")


def _cpu_features() -> dict[str, bool]:
    """numpy's run-time detection of the processor's features (what numpy.show_runtime prints)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:         # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__
    return __cpu_features__


def _processor() -> str:
    model = platform.processor() or "unknown processor"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((line.partition(":")[2].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} ({processor_isa() or platform.machine()})"


def _library_path(version: re.Match | None, available: bool, cap: str, processor: str) -> str:
    if not available or version is None:
        return "none"
    path = f"{cap}={os.environ[cap]}" if cap in os.environ else f"auto on {processor}"
    return f"{version.group(1)}, {path}"


def _openblas() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown"
    kernels = sorted({f"{library['version']} {library.get('architecture')}" for library in threadpool_info()
                      if library.get("internal_api") == "openblas"})
    return ", ".join(kernels) or "none"


def _processes(who: list) -> str:
    """`server, workers 0-2, 5`: process names, with workers' indices as ranges."""
    names = [name for name in who if name == "server"]
    indices = [index for index in who if index != "server"]
    ranges, start = [], None
    for position, index in enumerate(indices):
        if start is None:
            start = index
        if position + 1 == len(indices) or indices[position + 1] != index + 1:
            ranges.append(str(start) if start == index else f"{start}-{index}")
            start = None
    if indices:
        names.append(f"worker{'s' if len(indices) > 1 else ''} {', '.join(ranges)}")
    return ", ".join(names)

