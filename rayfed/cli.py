"""`rayfed run [CONFIG.yaml] [key=value ...] [--out DIR]`, `rayfed config ...`, `rayfed bench ...`,
`rayfed sweep ...` and `rayfed report ...`."""
from __future__ import annotations

import argparse
import functools
import os
import signal
import sys

from rayfed.errors import ConfigError, RunFinished, RunStopped, Terminated
from rayfed.report.options import add_report_arguments


def main(argv: list[str] | None = None) -> int:
    """`argv`: the arguments after `rayfed`; None: the command line's, whose command may start itself
    again with engine.cpu_isa's caps in its environment."""
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return _command(args, may_restart=argv is None)
    except ConfigError as error:
        print(f"rayfed: error: {error}", file=sys.stderr)
        return 2
    except RunFinished as finished:
        print(f"rayfed: {finished}")
        return 0
    except KeyboardInterrupt as interrupt:
        print(f"rayfed: {'terminated' if isinstance(interrupt, Terminated) else 'interrupted'}"
              f"{_where_it_stopped(interrupt)}", file=sys.stderr)
        return 143 if isinstance(interrupt, Terminated) else 130
    except RunStopped as stopped:
        print(f"rayfed: stopped: {stopped}", file=sys.stderr)
        return 1


# Built once per process: parsing leaves the parser as it was, and the tests call main() thousands of times.
@functools.cache
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rayfed", description="Federated-learning simulator on Ray.")
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="train; without CONFIG, the embedded quick-start")
    config_parser = commands.add_parser("config", help="print the fully resolved config and exit")
    for sub in (run_parser, config_parser):
        sub.add_argument("items", nargs="*", metavar="[CONFIG.yaml] [key=value ...]",
                         help="a YAML config file and/or dotted overrides such as train.rounds=10")
    run_parser.add_argument("--out", metavar="DIR", help="the run directory (must not exist or be empty)")
    run_parser.add_argument("--quiet", action="store_true", help="no progress bar")
    run_parser.add_argument("--resume", metavar="RUN_DIR",
                            help="continue RUN_DIR from its last checkpoint, with its own config; overrides may "
                                 "change train.rounds and logging.* alone")
    run_parser.add_argument("--accept-environment", action="store_true",
                            help="with --resume: go on where what decides the bits (torch build, CPU kernels, GPU "
                                 "model, ...) differs from the checkpoint's record")
    algorithms_parser = commands.add_parser("algorithms", help="list the registered algorithms, or one's parameters")
    algorithms_parser.add_argument("name", nargs="?", metavar="NAME", help="an algorithm: its parameters and capabilities")
    algorithms_parser.add_argument("items", nargs="*", metavar="plugins=[...]",
                                   help="plugins to load first, as in a config: plugins=[./my_alg.py]")
    bench_parser = commands.add_parser("bench", help="time workloads against a plain PyTorch loop")
    bench_parser.add_argument("items", nargs="*", metavar="[WORKLOAD] [key=value ...]",
                              help="workloads (tiny, lenet, huge_n, million; default all; and study, a sweep timed for "
                                   "its start-up, when named) and config overrides")
    bench_parser.add_argument("--engines", default="local,ray",
                              help="comma-separated, from local, ray, ray_driver, local_vec, ray_vec (default local,ray)")
    bench_parser.add_argument("--rounds", type=int, default=30, help="rounds per measurement (default 30)")
    bench_parser.add_argument("--repeats", type=int, default=1, help="measurements per engine (default 1)")
    bench_parser.add_argument("--json", metavar="PATH", default="bench.json",
                              help="where to write the results (default bench.json)")
    sweep_parser = commands.add_parser("sweep", help="run a grid of configs as Ray Tune trials")
    sweep_parser.add_argument("items", nargs="+", metavar="SWEEP.yaml [key=value ...]",
                              help="a sweep file (base config and grid) and overrides of its base")
    sweep_parser.add_argument("--out", metavar="DIR", help="the sweep directory (default sweeps/<file name>)")
    sweep_parser.add_argument("--select", metavar="METRIC", choices=("best_test_accuracy", "final_test_accuracy"),
                              help="after the sweep, pick per group the hyper-parameters with the best mean over "
                                   "seeds: best_test_accuracy or final_test_accuracy")
    sweep_parser.add_argument("--group", metavar="KEY", nargs="+", default=["algorithm.name"],
                              help="the keys that make a group for --select (default algorithm.name)")
    sweep_parser.add_argument("--quiet", action="store_true", help="no progress view")
    sweep_parser.add_argument("--pack", metavar="N", type=int,
                              help="run up to N trials that differ only in their seed and float values (learning "
                                   "rates, momenta, ...) as one batched computation (engine.vectorize on the local "
                                   "engine; default 32; 1: each trial alone)")
    sweep_parser.add_argument("--plan", action="store_true",
                              help="print the trials, what differs, the concurrency and the wall time estimated from "
                                   "a few calibration rounds; run nothing else")
    report_parser = commands.add_parser("report", help="tables and plots over run or sweep directories")
    add_report_arguments(report_parser)
    return parser


def _command(args, may_restart: bool) -> int:
    if args.command == "bench":
        return _bench(args)
    if args.command == "algorithms":
        return _algorithms(args.name, args.items)
    if args.command == "sweep":
        from rayfed.sweep.cli import sweep_command
        return sweep_command(args.items, args.out, args.select, args.group, not args.quiet, args.plan, args.pack)
    if args.command == "report":
        from rayfed.report.cli import report_from_args
        return report_from_args(args)
    if args.command == "run" and args.resume is not None:
        if args.out or any("=" not in item for item in args.items):
            raise ConfigError("--resume takes the run directory and key=value overrides alone (train.rounds, "
                              "logging.*): its config.yaml holds the config")
        if not args.resume.strip():
            raise ConfigError("--resume needs the run directory to continue, e.g. --resume runs/NAME")
        if may_restart:
            from rayfed.api import run_config
            _with_cpu_caps(run_config(args.resume).engine.cpu_isa)
        return _report(_resume(args.resume, args.items, not args.quiet, args.accept_environment))
    if args.command == "run" and args.accept_environment:
        raise ConfigError("--accept-environment goes with --resume RUN_DIR")
    config = _load(args.items)
    if args.command == "config":
        print(config.to_yaml(), end="")
        return 0
    if may_restart:
        _with_cpu_caps(config.engine.cpu_isa)
    return _run(config, args.out, not args.quiet)


def _with_cpu_caps(cpu_isa: str | None) -> None:
    """engine.cpu_isa: PyTorch, MKL and oneDNN read their caps at their first computation in a process,
    and reading the config computed already; so the command starts again, in this process, with the caps
    in its environment (once: then they are there)."""
    from rayfed.provenance import CAPS, check_processor
    if cpu_isa is None or all(os.environ.get(name) == value for name, value in CAPS[cpu_isa].items()):
        return
    check_processor(cpu_isa, "this machine")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "rayfed", *sys.argv[1:]], {**os.environ, **CAPS[cpu_isa]})


def _terminate(signum, frame) -> None:
    raise Terminated()


def _where_it_stopped(interrupt: KeyboardInterrupt) -> str:
    from rayfed.checkpoint import has_checkpoint
    run_dir = getattr(interrupt, "run_dir", None)
    rounds = getattr(interrupt, "rounds_completed", 0)
    if run_dir is None or not rounds:
        return ""
    if has_checkpoint(run_dir):
        return f" after round {rounds}; resume from the last checkpoint with: rayfed run --resume {run_dir}"
    return f" after round {rounds}; {run_dir} has no checkpoint to resume from (see train.checkpoint_every)"


def _load(items: list[str]):
    from rayfed.preflight import load_config
    paths = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    if len(paths) > 1:
        raise ConfigError(f"at most one config file, got {', '.join(paths)} "
                          f"(overrides look like key=value)")
    return load_config(paths[0] if paths else None, overrides)


def _algorithms(name: str | None, items: list[str]) -> int:
    from rayfed.algorithms.describe import describe_algorithm, list_algorithms
    if name is not None and "=" in name:
        name, items = None, [name, *items]
    _load(items)        # the plugins the overrides name, and the installed ones, register their algorithms
    print(describe_algorithm(name) if name else list_algorithms(), end="")
    return 0


def _bench(args) -> int:
    from rayfed.bench.cli import bench_command
    return bench_command(args.items, args.engines, args.rounds, args.repeats, args.json)


def _run(config, out: str | None, progress: bool) -> int:
    from rayfed.api import run
    return _report(run(config, run_dir=out, progress=progress))


def _resume(run_dir: str, overrides: list[str], progress: bool, accept_environment: bool):
    from rayfed.api import resume
    return resume(run_dir, progress=progress, overrides=overrides, accept_environment=accept_environment)


def _report(result) -> int:
    from rayfed.metrics import human_bytes
    s = result.summary
    print(f"rayfed: {s['algorithm']} on {s['dataset']} ({s['num_clients']} clients): "
          f"{s['rounds_completed']} rounds in {s['wall_time_s']:.1f} s (startup {s['startup_time_s']:.1f} s)")
    print(f"  test accuracy: final {s['final_test_accuracy']:.4f}, "
          f"best {s['best_test_accuracy']:.4f} (round {s['best_round']})")
    print(f"  traffic: {human_bytes(s['bytes_up_total'])} up, {human_bytes(s['bytes_down_total'])} down")
    if "stopped_because" in s:
        print(f"  {s['status']}: {s['stopped_because']}")
    print(f"  run directory: {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
