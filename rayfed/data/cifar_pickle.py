"""Reading CIFAR's python batch files without running anything a crafted file names.

pickle.load would call whatever callable a file in data.root names. This unpickler builds only
what CIFAR batches hold (dicts, lists, strings, numbers, numpy arrays of plain numbers), rebuilds
arrays from the file's own bytes, and bounds what a crafted file can make it allocate.
"""
from __future__ import annotations

import io
import math
import pickle
from typing import Any

import numpy as np

# Official batches make about ten containers.
MAX_CONTAINERS = 1000
MAX_ARRAY_DIMS = 32     # numpy 1's limit
# No array dimension of an official file comes near this (the largest file is 158 MB).
MAX_DIMENSION = 2**28


def load_cifar_pickle(raw: bytes) -> Any:
    """The unpickled value, arrays still wrapped (see unwrap). A damaged or crafted file raises
    pickle.UnpicklingError, EOFError, struct.error, ValueError, TypeError, AttributeError,
    IndexError, OverflowError or MemoryError."""
    return _CifarUnpickler(io.BytesIO(raw)).load()


class _CifarUnpickler(pickle._Unpickler):
    """Builds only what CIFAR batches hold (dicts, lists, strings, numbers, numpy arrays): plain
    pickle.load would run whatever callable a crafted file in data.root names. Python's unpickler
    rather than the C one, which is no faster here: the C one allocates and zeroes its memo up to
    the largest index a file names (32 GiB for a LONG_BINPUT of 2**31), the Python one keeps a dict.
    The official files are Python 2 pickles, whose byte strings only latin1 maps one to one onto str."""

    def __init__(self, file):
        super().__init__(file, encoding="latin1")
        self.containers = 0

    def find_class(self, module: str, name: str):
        if (module, name) not in _CIFAR_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no CIFAR batch holds; refused")
        return _CIFAR_PICKLE_GLOBALS[module, name]


class _CifarOpcodes(dict):
    def __missing__(self, opcode: int):
        raise pickle.UnpicklingError(f"it holds 0x{opcode:02x} where a pickle opcode of a CIFAR batch belongs")


def _load_build(unpickler: _CifarUnpickler) -> None:
    # BUILD sets an object's state or attributes: only the array and dtype stand-ins take one,
    # not the functions find_class hands out (a crafted file could set their __defaults__).
    state = unpickler.stack.pop()
    target = unpickler.stack[-1]
    if not isinstance(target, (_PickledArray, _PickledDtype)):
        raise pickle.UnpicklingError(f"it sets the state of a {type(target).__name__}, which takes none")
    target.__setstate__(state)


def _counting_container(load):
    # Hashing a tuple nested a million deep (a 1 MB file) overflows the C stack: a segfault, not
    # an exception. Official batches make about ten containers.
    def load_container(unpickler: _CifarUnpickler) -> None:
        unpickler.containers += 1
        if unpickler.containers > MAX_CONTAINERS:
            raise pickle.UnpicklingError(f"it makes more than {MAX_CONTAINERS} containers, "
                                         "more than any CIFAR batch")
        load(unpickler)
    return load_container


def _cifar_opcodes() -> _CifarOpcodes:
    """Python's unpickler's dispatch table, less protocol 5's buffer opcodes (BYTEARRAY8 allocates
    and zeroes as many bytes as the file declares), with BUILD and containers restricted."""
    opcodes = _CifarOpcodes(pickle._Unpickler.dispatch)
    for opcode in (pickle.BYTEARRAY8, pickle.NEXT_BUFFER, pickle.READONLY_BUFFER):
        del opcodes[opcode[0]]
    opcodes[pickle.BUILD[0]] = _load_build
    for opcode in (pickle.EMPTY_DICT, pickle.DICT, pickle.EMPTY_LIST, pickle.LIST, pickle.TUPLE, pickle.TUPLE1,
                   pickle.TUPLE2, pickle.TUPLE3, pickle.EMPTY_SET, pickle.FROZENSET):
        opcodes[opcode[0]] = _counting_container(opcodes[opcode[0]])
    return opcodes


_CifarUnpickler.dispatch = _cifar_opcodes()


class _PickledDtype:
    """What the pickle's numpy.dtype(spec, align, copy) call and its state stand for. numpy's own
    dtype would take the state whole, and a crafted one (flags saying the bytes are object
    pointers) corrupts memory: only plain numbers are rebuilt, from spec and byte order alone."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype

    def __setstate__(self, state) -> None:
        if not (isinstance(state, tuple) and len(state) > 1):
            raise pickle.UnpicklingError("it holds a numpy dtype with a malformed state")
        if state[1] in ("<", ">"):
            self.dtype = self.dtype.newbyteorder(state[1])


# Plain numbers, as numpy names them in pickles: np.dtype would parse any other string (commas
# and repeats through ast.literal_eval), and its failures are not all ValueError or TypeError.
_PICKLED_DTYPE_SPECS = frozenset({"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8"})


def _pickled_dtype(spec, align=False, copy=False) -> _PickledDtype:
    if not isinstance(spec, str):
        raise pickle.UnpicklingError(f"it holds a numpy dtype made from a {type(spec).__name__}")
    if spec not in _PICKLED_DTYPE_SPECS:
        raise pickle.UnpicklingError(f"it holds arrays of dtype {spec!r}, which no CIFAR batch holds")
    return _PickledDtype(np.dtype(spec))


class _PickledArray:
    """What a pickled numpy array stands for: _reconstruct(ndarray, (0,), b'b') makes it, its
    state (version, shape, dtype, Fortran order, data) fills it. Rebuilt by np.frombuffer, the
    array is made of the file's bytes: no shape in a crafted file can allocate beyond them."""

    array: np.ndarray | None = None

    def __setstate__(self, state) -> None:
        if not (isinstance(state, tuple) and len(state) == 5):
            raise pickle.UnpicklingError("it holds a numpy array with a malformed state")
        _, shape, dtype, fortran_order, data = state
        if not (isinstance(shape, tuple) and len(shape) <= MAX_ARRAY_DIMS
                and all(type(dim) is int and 0 <= dim <= MAX_DIMENSION for dim in shape)
                and isinstance(dtype, _PickledDtype) and isinstance(data, (str, bytes))):
            raise pickle.UnpicklingError("it holds a numpy array with a malformed state")
        # Python 2's byte strings arrive as latin1 str (see _CifarUnpickler); Python 3's as bytes.
        raw = data.encode("latin-1") if isinstance(data, str) else data
        if len(raw) != math.prod(shape) * dtype.dtype.itemsize:
            raise pickle.UnpicklingError(f"it holds a numpy array of shape {shape} and dtype {dtype.dtype} "
                                         f"with {len(raw)} bytes of data")
        self.array = np.frombuffer(raw, dtype=dtype.dtype).reshape(shape, order="F" if fortran_order else "C")


# Stands for numpy.ndarray in the pickle: a marker that only _array_shell accepts, so that a
# crafted file cannot call ndarray(huge shape) itself.
_NDARRAY_TYPE = object()


def _array_shell(subtype, shape, typecode) -> _PickledArray:
    if subtype is not _NDARRAY_TYPE or shape != (0,):
        raise pickle.UnpicklingError("it holds an array in a form numpy never pickles")
    return _PickledArray()


def unwrap(value):
    """An array the pickle held, as numpy; any other value as it is."""
    return value.array if isinstance(value, _PickledArray) else value


def _latin1_bytes(text, encoding) -> bytes:
    """codecs.encode, which Python 3 pickles bytes with under protocol 2, for that use only."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError("it calls codecs.encode other than to pickle bytes")
    return text.encode("latin-1")


def _empty_bytes() -> bytes:
    """bytes(), which Python 3 pickles b'' with under protocol 2."""
    return b""


_CIFAR_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _array_shell,
    ("numpy._core.multiarray", "_reconstruct"): _array_shell,   # numpy 2's name for it
    ("numpy", "ndarray"): _NDARRAY_TYPE,
    ("numpy", "dtype"): _pickled_dtype,
    ("_codecs", "encode"): _latin1_bytes,
    ("__builtin__", "bytes"): _empty_bytes,
}
