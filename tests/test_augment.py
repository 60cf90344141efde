"""data.augment: random 4-pixel-padded crops and horizontal flips, per minibatch, from each client's own stream."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import rayfed
from rayfed.data.augment import random_crop_flip
from rayfed.engine.worker import ClientTask
from rayfed.errors import ConfigError
from rayfed.models import FlatModel, build_model
from rayfed.seeding import Purpose, torch_generator
from tests.test_engine_equivalence import ON_RAY, assert_same_run, run


def windows(image):
    """Every crop random_crop_flip may return for `image` (C, H, W): {(row, column, flipped): crop}."""
    _, height, width = image.shape
    padded = F.pad(image, (4, 4, 4, 4))
    return {(row, column, flipped): padded[:, row:row + height, column:column + width].flip(-1) if flipped
            else padded[:, row:row + height, column:column + width]
            for row, column, flipped in itertools.product(range(9), range(9), (False, True))}


def test_every_output_is_a_padded_window_flipped_or_not_and_every_one_occurs():
    image = torch.arange(1, 17, dtype=torch.float32).view(1, 4, 4)
    candidates = windows(image)
    crops = random_crop_flip(image.expand(4000, 1, 4, 4), torch.Generator().manual_seed(0))
    assert crops.shape == (4000, 1, 4, 4)
    seen = set()
    for crop in crops:
        matches = [key for key, window in candidates.items() if torch.equal(crop, window)]
        assert matches, f"{crop} is no window of the padded image"
        seen.update(matches)
    assert len(seen) == 9 * 9 * 2        # all 81 offsets, each plain and mirrored


def test_all_channels_of_an_image_get_its_one_crop():
    images = torch.randn(64, 3, 6, 5)
    crops = random_crop_flip(images, torch.Generator().manual_seed(1))
    keys = []
    for image, crop in zip(images, crops):
        key = next(key for key, window in windows(image).items() if torch.equal(crop, window))
        keys.append(key)
    assert len(set(keys)) > 1
    assert crops.dtype == images.dtype and crops.device == images.device


TRAIN_X = torch.randn(40, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def make_task(client, augment, seed=3, round=2):
    return ClientTask(FlatModel(build_model("logreg", (3, 8, 8), 2)), TRAIN_X, torch.arange(40) % 2, torch.arange(40),
                      8, torch_generator(seed, Purpose.BATCHES, round, client),
                      torch_generator(seed, Purpose.AUGMENT, round, client) if augment else None)


def test_the_same_client_and_round_augment_alike_and_other_clients_differ():
    task, again, other = make_task(5, True), make_task(5, True), make_task(6, True)
    for _ in range(3):
        inputs = task.next_batch()[0]
        assert inputs.shape == (8, 3, 8, 8) and torch.equal(inputs, again.next_batch()[0])
    assert not torch.equal(make_task(5, True).next_batch()[0], other.next_batch()[0])


def test_augmentation_leaves_the_minibatches_as_they_were():
    plain, augmented = make_task(5, False), make_task(5, True)
    for _ in range(7):                                    # across an epoch's reshuffle
        rows = plain.next_rows()
        assert torch.equal(rows, augmented.next_rows())
        assert torch.equal(plain.inputs(rows), TRAIN_X[rows]) and not torch.equal(augmented.inputs(rows), TRAIN_X[rows])


def test_augment_needs_image_data():
    with pytest.raises(ConfigError) as raised:
        rayfed.load_config(None, ["data.dataset=synthetic", "data.augment=true"])
    message = str(raised.value)
    assert message.startswith("data.augment=true crops and flips images; data.dataset=synthetic") and "\n" not in message


@pytest.fixture(scope="module")
def cifar_logreg(cifar_lenet):
    """The engine tests' CIFAR files, with logistic regression: a model engine.vectorize takes whatever the
    clients' sizes."""
    return cifar_lenet + ["train.local_steps=3", "model.name=logreg", "algorithm.name=fedavg",
                          "algorithm.lr_local=0.05"]


def test_augment_off_is_the_default_run_and_on_changes_it(tmp_path, cifar_logreg):
    default = run(tmp_path, cifar_logreg + ["engine.backend=local"], "default")
    off = run(tmp_path, cifar_logreg + ["engine.backend=local", "data.augment=false"], "off")
    on = run(tmp_path, cifar_logreg + ["engine.backend=local", "data.augment=true"], "on")
    assert_same_run(default, off)
    assert not torch.equal(default.params, on.params)


def test_vectorized_clients_augment_as_they_would_alone(tmp_path, cifar_logreg):
    overrides = cifar_logreg + ["engine.backend=local", "data.augment=true"]
    sequential = run(tmp_path, overrides, "sequential")
    vectorized = run(tmp_path, overrides + ["engine.vectorize=true"], "vectorized")
    assert vectorized.summary["vectorized"]
    torch.testing.assert_close(vectorized.params, sequential.params, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_local_and_ray_with_2_workers_augment_bitwise_alike(tmp_path, ray_cluster, cifar_logreg):
    overrides = cifar_logreg + ["data.augment=true", "model.name=lenet5", "algorithm.name=fedproxm"]
    reference = run(tmp_path, overrides + ["engine.backend=local"], "local")
    other = run(tmp_path, overrides + [*ON_RAY, "engine.num_workers=2"], "ray2")
    assert_same_run(reference, other)
