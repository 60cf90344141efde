"""Writers of small datasets in the official on-disk formats (IDX for MNIST, pickled batches for CIFAR),
and of damaged or crafted variants of them."""
import gzip
import math
import os
import pickle
import struct
import zlib

import numpy as np

NUM_TRAIN = 50
NUM_TEST = 20
IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def idx_bytes(array: np.ndarray) -> bytes:
    """The official IDX layout: 0x0000 08 <ndim> magic, big-endian int32 dims, uint8 data."""
    return idx_header(array.shape) + array.astype(np.uint8).tobytes()


def idx_header(shape: tuple[int, ...], type_code: int = 0x08, num_dims: int | None = None) -> bytes:
    """An IDX header that may lie: any dims (written as signed int32), any type code, any dims count."""
    magic = bytes([0, 0, type_code, len(shape) if num_dims is None else num_dims])
    return magic + struct.pack(f">{len(shape)}i", *shape)


def gzip_bomb(decompressed_bytes: int) -> bytes:
    """A small .gz that decompresses to `decompressed_bytes` zeros, compressed a chunk at a time."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)   # 16 +: gzip framing
    chunk = bytes(2**20)
    parts = [compressor.compress(chunk) for _ in range(decompressed_bytes // len(chunk))]
    return b"".join(parts) + compressor.flush()


def flip_middle_bytes(data: bytes, count: int = 16) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(byte ^ 0xFF for byte in data[middle:middle + count]) + data[middle + count:]


def write_idx_dataset(folder, rng, gz=False) -> dict[str, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        IDX_NAMES[0]: rng.integers(0, 256, (NUM_TRAIN, 28, 28), dtype=np.uint8),
        IDX_NAMES[1]: rng.integers(0, 10, NUM_TRAIN, dtype=np.uint8),
        IDX_NAMES[2]: rng.integers(0, 256, (NUM_TEST, 28, 28), dtype=np.uint8),
        IDX_NAMES[3]: rng.integers(0, 10, NUM_TEST, dtype=np.uint8),
    }
    for name, array in arrays.items():
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(idx_bytes(array)))
        else:
            (folder / name).write_bytes(idx_bytes(array))
    return arrays


def write_cifar_batch(path, images: np.ndarray, labels: np.ndarray, label_key: str, bytes_keys=False) -> None:
    path.write_bytes(cifar_batch_bytes(images, labels, label_key, bytes_keys))


def cifar_batch_bytes(images: np.ndarray, labels: np.ndarray, label_key: str, bytes_keys=False) -> bytes:
    batch = {"batch_label": "test batch", "data": images.reshape(len(images), math.prod(images.shape[1:])),
             label_key: labels.tolist(), "filenames": [f"img_{i}.png" for i in range(len(images))]}
    if bytes_keys:   # what a pickle written by Python 3 from an encoding='bytes' load looks like
        batch = {key.encode(): value for key, value in batch.items()}
    return pickle.dumps(batch, protocol=2)


def write_cifar10(root, rng, num_train: int = NUM_TRAIN, num_test: int = NUM_TEST) -> tuple[np.ndarray, ...]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    train_x = rng.integers(0, 256, (num_train, 3, 32, 32), dtype=np.uint8)
    train_y = rng.integers(0, 10, num_train)
    for batch_id, rows in enumerate(np.array_split(np.arange(num_train), 5), start=1):
        write_cifar_batch(folder / f"data_batch_{batch_id}", train_x[rows], train_y[rows], "labels")
    test_x = rng.integers(0, 256, (num_test, 3, 32, 32), dtype=np.uint8)
    test_y = rng.integers(0, 10, num_test)
    write_cifar_batch(folder / "test_batch", test_x, test_y, "labels")
    return train_x, train_y, test_x, test_y


class _Python2Pickler(pickle._Pickler):
    """Pickles as Python 2's cPickle wrote the official CIFAR files: str and bytes as Python 2
    byte strings, numpy's array reconstructor under its numpy 1 module name."""
    dispatch = pickle._Pickler.dispatch.copy()

    def save_byte_string(self, obj):
        data = obj.encode("latin-1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[str] = dispatch[bytes] = save_byte_string

    def save_global(self, obj, name=None):
        module = obj.__module__.replace("numpy._core", "numpy.core")
        self.write(pickle.GLOBAL + f"{module}\n{name or obj.__qualname__}\n".encode())
        self.memoize(obj)


def write_python2_cifar_batch(path, images: np.ndarray, labels: np.ndarray, label_key: str) -> None:
    batch = {"batch_label": "testing batch 1 of 1", "data": images.reshape(len(images), -1),
             label_key: labels.tolist(), "filenames": [f"img_{i}.png" for i in range(len(images))]}
    with path.open("wb") as file:
        _Python2Pickler(file, protocol=2).dump(batch)


class CallOnLoad:
    """Unpickling it calls `function(*arguments)`: what a crafted file in the data directory can
    make a plain pickle.load do."""

    def __init__(self, function, *arguments):
        self.function, self.arguments = function, arguments

    def __reduce__(self):
        return self.function, self.arguments


def malicious_pickles(marker) -> dict[str, bytes]:
    """Pickles that create the file `marker` when plain pickle.loads reads them."""
    write_marker = f"open({str(marker)!r}, 'w').write('ran')"
    return {
        "exec": pickle.dumps({"data": CallOnLoad(exec, write_marker)}, protocol=0),
        "os.system": pickle.dumps(CallOnLoad(os.system, f"touch '{marker}'"), protocol=4),
        "eval_in_labels": pickle.dumps({"data": np.zeros((1, 3072), np.uint8),
                                        "labels": [CallOnLoad(eval, write_marker)]}, protocol=2),
    }


# Hand-assembled pickles that attack the unpickler itself rather than name a callable to run.
HOSTILE_PICKLES = {
    # EMPTY_LIST, LONG_BINPUT 2**31 - 1: the C unpickler allocates and zeroes a 32 GiB memo for it
    "memo_index_2**31": b"\x80\x02]r\xff\xff\xff\x7f.",
    # BYTEARRAY8 of 1 TiB: Python's unpickler allocates and zeroes it before reading a byte
    "bytearray8_1TiB": b"\x80\x05\x96" + struct.pack("<Q", 2**40) + b".",
    # {(((...),),): 1}, a million deep: hashing the key overflows the C stack
    "tuple_a_million_deep": b"\x80\x02()" + b"\x85" * 10**6 + b"K\x01d.",
    # GLOBAL _codecs.encode, EMPTY_DICT, BUILD: sets attributes of what find_class handed out
    "state_of_a_function": b"\x80\x02c_codecs\nencode\n}b.",
}


def with_object_dtype_flags(python2_batch: bytes) -> bytes:
    """The batch with its uint8 dtype's pickled flags saying the items are object pointers:
    numpy's own unpickling takes them and then treats pixel bytes as pointers."""
    flags = b"J\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00t"   # elsize -1, alignment -1, flags 0
    assert python2_batch.count(flags) == 1
    return python2_batch.replace(flags, flags[:-2] + b"\x3ft")
