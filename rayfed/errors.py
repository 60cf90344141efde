"""The exception types that reach the user as one line."""


def first_line(error: BaseException) -> str:
    """What a foreign exception says, as much as fits one line of ours."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def kind_of(value) -> str:
    """How a line names a value it did not expect: a tensor by its shape and dtype, else by its type."""
    from torch import Tensor
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return "None" if value is None else f"a {type(value).__name__}"


class ConfigError(ValueError):
    """Bad input (config key, value, file): reported as one line, exit code 2, before any work."""


class RunFinished(Exception):
    """`--resume` of a run that already completed all its rounds: nothing to do, nothing changed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the run stops at once and Ray is shut down."""


class RunStopped(Exception):
    """The run cannot go on (it diverged, or an actor is out of restarts). `str()` is one line for
    the user; `status` goes into summary.json; exit code 1."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status
