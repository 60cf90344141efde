"""Imported at start-up by every Python process of a test node whose environment names this folder in
PYTHONPATH (tests/multinode_run.py, `own_disks`): that node then has a disk of its own, as the nodes of
a cluster without a shared file system do, though all nodes run on one machine.

RAYFED_TEST_NO_DIR: a directory that is not on this node (the driver's run directory): opening, creating,
listing or removing anything under it fails with ENOENT.
RAYFED_TEST_OWN_DIR: SHARED=OWN: paths under SHARED are this node's own, under OWN instead.

Only Python's own calls are redirected (open, and os's open, mkdir, unlink, rmdir, stat, lstat, listdir
and scandir): what a worker does with client-state files. A library writing through C (torch.save) or
os.replace would still reach the shared paths; rayfed's workers do neither."""
import builtins
import errno
import io
import os

_NO_DIR = os.environ.get("RAYFED_TEST_NO_DIR")
_SHARED, _, _OWN = os.environ.get("RAYFED_TEST_OWN_DIR", "").partition("=")


def _under(text: str, directory: str) -> bool:
    return bool(directory) and (text == directory or text.startswith(directory + os.sep))


def _here(path):
    """`path` as this node sees it."""
    if isinstance(path, int):
        return path
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        return path
    absolute = os.path.abspath(text)
    if _under(absolute, _NO_DIR):
        raise FileNotFoundError(errno.ENOENT, "not on this node", text)
    if _under(absolute, _SHARED):
        return _OWN + absolute[len(_SHARED):]
    return path


def _first_argument_here(function):
    def on_this_node(*args, **keywords):
        return function(*(_here(args[0]), *args[1:]) if args else (), **keywords)
    return on_this_node


if _NO_DIR:
    builtins.open = io.open = _first_argument_here(io.open)
    for _name in ("open", "mkdir", "unlink", "rmdir", "stat", "lstat", "listdir", "scandir"):
        setattr(os, _name, _first_argument_here(getattr(os, _name)))
