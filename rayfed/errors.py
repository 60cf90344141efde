"""The exception types that reach the user as one line."""
import math
import reprlib


def first_line(error: BaseException) -> str:
    """What a foreign exception says, as much as fits one line of ours."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def kind_of(value) -> str:
    """How a line names a value it did not expect: a tensor by its shape and dtype, else by its type."""
    from torch import Tensor
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return "None" if value is None else f"a {type(value).__name__}"


class _ShortRepr(reprlib.Repr):
    """repr for messages: short, one line, and safe for integers too long for str()."""

    def __init__(self):
        super().__init__()
        self.maxstring, self.maxother, self.maxlist, self.maxdict, self.maxlevel = 80, 80, 6, 6, 3

    def repr_int(self, value, level):
        if value.bit_length() > 256:
            return f"<an integer of about {round(value.bit_length() * math.log10(2))} digits>"
        return super().repr_int(value, level)


show = _ShortRepr().repr


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

    def __reduce__(self):
        # Exception's own would call __init__ with the message alone, which fails on unpickling (as in a
        # Ray Tune trial's error), for subclasses too whose __init__ takes other arguments.
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls: type, args: tuple, attributes: dict) -> BaseException:
    error = cls.__new__(cls, *args)
    error.__dict__.update(attributes)
    return error
