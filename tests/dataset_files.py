"""Writers of small datasets in the official on-disk formats (IDX for MNIST, pickled batches for CIFAR)."""
import gzip
import pickle

import numpy as np

NUM_TRAIN = 50
NUM_TEST = 20
IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def idx_bytes(array: np.ndarray) -> bytes:
    """The official IDX layout: 0x0000 08 <ndim> magic, big-endian int32 dims, uint8 data."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">i4").tobytes()
    return header + array.astype(np.uint8).tobytes()


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
    batch = {"batch_label": "test batch", "data": images.reshape(len(images), -1), label_key: labels.tolist(),
             "filenames": [f"img_{i}.png" for i in range(len(images))]}
    if bytes_keys:   # what a pickle written by Python 3 from an encoding='bytes' load looks like
        batch = {key.encode(): value for key, value in batch.items()}
    path.write_bytes(pickle.dumps(batch, protocol=2))


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
