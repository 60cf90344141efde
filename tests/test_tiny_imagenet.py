"""data.dataset=tiny_imagenet on a generated tiny-imagenet-200/ tree in the official layout.

The tree is small but keeps Tiny-ImageNet's 200 classes, which the dataset declares (the models
are built with 200 outputs before anything is read): wnids.txt lists 200 wnids, in an order that
is not sorted, each with two training JPEGs, and val_annotations.txt labels 30 validation JPEGs.
Every image is one solid colour whose red value is its class, which JPEG keeps to within a level
or two."""
import io
import shutil

import numpy as np
import pytest
from PIL import Image

import rayfed
from rayfed.cli import main
from rayfed.preflight import load_config
from rayfed.data import load_dataset, missing_files, required_files
from rayfed.errors import ConfigError

URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
MEAN = np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
WNIDS = [f"n{(37 * index) % 200 + 1000:08d}" for index in range(200)]     # a permutation, not sorted
TRAIN_PER_CLASS = 2
VAL_LABELS = np.random.default_rng(0).integers(0, 200, 30)
GRAY = (7, 1)           # the second training image of class 7 is a grayscale JPEG
GRAY_LEVEL = 90


def colour(label: int, index: int) -> tuple[int, int, int]:
    return label, 60 + 40 * index, 250 - label


def write_jpeg(path, rgb, side=64) -> None:
    Image.new("RGB", (side, side), rgb).save(path, "JPEG", quality=95)


def write_tree(root):
    base = root / "tiny-imagenet-200"
    base.mkdir(parents=True)
    (base / "wnids.txt").write_text("".join(f"{wnid}\n" for wnid in WNIDS))
    for label, wnid in enumerate(WNIDS):
        images = base / "train" / wnid / "images"
        images.mkdir(parents=True)
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        for index in range(TRAIN_PER_CLASS):
            path = images / f"{wnid}_{index}.JPEG"
            if (label, index) == GRAY:
                Image.new("L", (64, 64), GRAY_LEVEL).save(path, "JPEG", quality=95)
            else:
                write_jpeg(path, colour(label, index))
    (base / "val" / "images").mkdir(parents=True)
    lines = []
    for index, label in enumerate(VAL_LABELS):
        write_jpeg(base / "val" / "images" / f"val_{index}.JPEG", colour(int(label), 2))
        lines.append(f"val_{index}.JPEG\t{WNIDS[label]}\t0\t3\t60\t62\n")
    (base / "val" / "val_annotations.txt").write_text("".join(lines))
    return base


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "data")


def load(base):
    return load_dataset("tiny_imagenet", root=str(base.parent))


def pixels(images: np.ndarray) -> np.ndarray:
    """0..255 again, from the normalised inputs."""
    return (images * STD + MEAN) * 255


def assert_error(raised: pytest.ExceptionInfo, expected: str) -> None:
    assert str(raised.value) == expected and "\n" not in expected


def test_shapes_labels_and_pixels(tree):
    dataset = load(tree)
    assert dataset.name == "tiny_imagenet" and dataset.num_classes == 200 and dataset.input_shape == (3, 64, 64)
    assert dataset.train_x.shape == (400, 3, 64, 64) and dataset.test_x.shape == (30, 3, 64, 64)
    assert dataset.train_x.dtype == dataset.test_x.dtype == np.float32
    assert dataset.train_y.dtype == dataset.test_y.dtype == np.int64
    # classes in wnids.txt's order: label k is the k-th line, whose images have red value k
    np.testing.assert_array_equal(dataset.train_y, np.repeat(np.arange(200), TRAIN_PER_CLASS))
    np.testing.assert_array_equal(dataset.test_y, VAL_LABELS)
    train, test = pixels(dataset.train_x), pixels(dataset.test_x)
    gray_row = GRAY[0] * TRAIN_PER_CLASS + GRAY[1]
    coloured = np.arange(400) != gray_row
    np.testing.assert_allclose(train[coloured, 0].mean(axis=(1, 2)), dataset.train_y[coloured], atol=2.5)
    np.testing.assert_allclose(train[coloured, 2].mean(axis=(1, 2)), 250 - dataset.train_y[coloured], atol=2.5)
    np.testing.assert_allclose(test[:, 0].mean(axis=(1, 2)), VAL_LABELS, atol=2.5)
    # grayscale JPEGs become RGB: the one channel in all three
    np.testing.assert_allclose(train[gray_row], GRAY_LEVEL, atol=2.5)
    # PIL's decoded pixels, channel-first, normalised with ImageNet's statistics
    wnid = WNIDS[5]
    reference = np.asarray(Image.open(tree / "train" / wnid / "images" / f"{wnid}_1.JPEG").convert("RGB"))
    expected = (reference.transpose(2, 0, 1)[np.newaxis] / 255.0 - MEAN) / STD
    np.testing.assert_allclose(dataset.train_x[5 * TRAIN_PER_CLASS + 1], expected[0], atol=1e-5)


def test_the_cache_is_written_once_then_read(tree, capsys):
    first = load(tree)
    assert capsys.readouterr().err == (f"rayfed: tiny_imagenet: decoding 430 JPEGs into {tree}/rayfed_cache.npz; "
                                       "later runs read that\n")
    with np.load(tree / "rayfed_cache.npz") as cache:
        assert cache["train_x"].dtype == np.uint8 and cache["train_x"].shape == (400, 3, 64, 64)
        assert cache["test_x"].shape == (30, 3, 64, 64)
    assert sorted(path.name for path in tree.iterdir()) == ["rayfed_cache.npz", "train", "val", "wnids.txt"]
    # A JPEG broken after the cache was made: only a load that reads the cache can still succeed.
    (tree / "train" / WNIDS[3] / "images" / f"{WNIDS[3]}_0.JPEG").write_bytes(b"broken")
    (tree / "val" / "images" / "val_4.JPEG").write_bytes(b"broken")
    second = load(tree)
    assert capsys.readouterr().err == ""
    for name in ("train_x", "train_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(second, name), getattr(first, name))


@pytest.mark.parametrize("change, train_size, test_size", [
    (lambda base: (base / "train" / WNIDS[0] / "images" / f"{WNIDS[0]}_1.JPEG").unlink(), 399, 30),
    (lambda base: write_jpeg(base / "train" / WNIDS[9] / "images" / f"{WNIDS[9]}_7.JPEG", (1, 2, 3)), 401, 30),
    (lambda base: (base / "val" / "val_annotations.txt").write_text(
        (base / "val" / "val_annotations.txt").read_text().split("\n", 1)[1]), 400, 29),
], ids=["train_image_removed", "train_image_added", "val_line_removed"])
def test_the_cache_is_rebuilt_when_the_files_change(tree, capsys, change, train_size, test_size):
    load(tree)
    capsys.readouterr()
    change(tree)
    dataset = load(tree)
    assert len(dataset.train_y) == train_size and len(dataset.test_y) == test_size
    assert "decoding" in capsys.readouterr().err
    load(tree)
    assert capsys.readouterr().err == ""            # the rebuilt cache is the one read now


def test_relabelled_validation_images_rebuild_the_cache(tree):
    load(tree)
    annotations = tree / "val" / "val_annotations.txt"
    annotations.write_text(annotations.read_text().replace(WNIDS[VAL_LABELS[0]], WNIDS[199 - VAL_LABELS[0]]))
    assert load(tree).test_y[0] == 199 - VAL_LABELS[0]


def test_a_damaged_cache_is_rebuilt(tree, capsys):
    expected = load(tree)
    capsys.readouterr()
    cache = tree / "rayfed_cache.npz"
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    np.testing.assert_array_equal(load(tree).train_x, expected.train_x)
    assert "decoding" in capsys.readouterr().err
    with np.load(cache) as arrays:
        assert arrays["train_x"].shape == (400, 3, 64, 64)


def test_a_cache_that_cannot_be_written_costs_only_a_note(tree, capsys):
    (tree / "rayfed_cache.npz").mkdir()         # unwritable even for root
    load(tree)
    err = capsys.readouterr().err
    assert f"rayfed: tiny_imagenet: could not write the cache {tree}/rayfed_cache.npz (" in err
    assert err.endswith("); the next run decodes the JPEGs again\n")
    assert not [path for path in tree.iterdir() if path.name.endswith(".tmp")]


def jpeg_bytes(side=64) -> bytes:
    buffer = io.BytesIO()
    noise = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, "JPEG")
    return buffer.getvalue()


def without_class_folder(base):
    shutil.rmtree(base / "train" / WNIDS[8])


def without_class_images(base):
    for path in (base / "train" / WNIDS[8] / "images").iterdir():
        path.unlink()


TRAIN_JPEG = f"train/{WNIDS[3]}/images/{WNIDS[3]}_1.JPEG"
ANNOTATIONS = "val/val_annotations.txt"
# (the file written, its new bytes or a change of the tree, the file named, what the line says of it)
BROKEN_FILES = [
    pytest.param(TRAIN_JPEG, b"not a jpeg", TRAIN_JPEG, "is not a JPEG image", id="garbage_jpeg"),
    pytest.param(TRAIN_JPEG, jpeg_bytes(side=32), TRAIN_JPEG,
                 "is 32x32 pixels, not the 64x64 of every Tiny-ImageNet image", id="32x32_jpeg"),
    pytest.param("wnids.txt", "\n".join(WNIDS[:199]).encode(), "wnids.txt",
                 "lists 199 wnids, not the 200 classes of Tiny-ImageNet", id="199_wnids"),
    pytest.param("wnids.txt", "\n".join(WNIDS[:199] + [WNIDS[4]]).encode(), "wnids.txt",
                 f"lists {WNIDS[4]} twice", id="repeated_wnid"),
    pytest.param("wnids.txt", "\n".join(WNIDS[:199] + ["../x"]).encode(), "wnids.txt",
                 "lists '../x', which is not a WordNet id (n and 8 digits)", id="not_a_wnid"),
    pytest.param(ANNOTATIONS, b"val_0.JPEG\tn99999999\t0\t0\t1\t1\n", ANNOTATIONS,
                 "line 1 gives val_0.JPEG the wnid 'n99999999', which wnids.txt does not list", id="unknown_wnid"),
    pytest.param(ANNOTATIONS, b"../wnids.txt\tn00001000\n", ANNOTATIONS,
                 "line 1 names '../wnids.txt', not a .JPEG file in {base}/val/images", id="path_in_annotations"),
    pytest.param(ANNOTATIONS, b"val_0.JPEG n00001000\n", ANNOTATIONS,
                 "line 1 is not a file name and a wnid separated by a tab", id="no_tab"),
    pytest.param(ANNOTATIONS, b"val_0.JPEG\tn00001000\nval_0.JPEG\tn00001000\n", ANNOTATIONS,
                 "line 2 lists val_0.JPEG a second time", id="repeated_annotation"),
    pytest.param(ANNOTATIONS, b"\n\n", ANNOTATIONS, "lists no image", id="no_annotations"),
    pytest.param(ANNOTATIONS, b"val_99.JPEG\tn00001000\n", "val/images/val_99.JPEG", "does not exist",
                 id="val_image_absent"),
    pytest.param(None, without_class_folder, f"train/{WNIDS[8]}/images", f"does not exist (wnids.txt lists {WNIDS[8]})",
                 id="class_folder_absent"),
    pytest.param(None, without_class_images, f"train/{WNIDS[8]}/images", "holds no .JPEG file", id="class_empty"),
]


@pytest.mark.parametrize("written, damage, named, problem", BROKEN_FILES)
def test_a_damaged_file_is_one_line_naming_it(tree, written, damage, named, problem):
    if written is None:
        damage(tree)
    else:
        (tree / written).write_bytes(damage)
    with pytest.raises(ConfigError) as raised:
        load(tree)
    assert_error(raised, f"{tree / named} {problem.format(base=tree)}; restore it from the official archive {URL}")


def test_a_truncated_jpeg_is_one_line_naming_it(tree):
    path = tree / "val" / "images" / "val_7.JPEG"
    path.write_bytes(jpeg_bytes()[:1500])
    with pytest.raises(ConfigError) as raised:
        load(tree)
    message = str(raised.value)
    assert message.startswith(f"{path} cannot be decoded as a JPEG (image file is truncated (") and "\n" not in message
    assert message.endswith(f"); restore it from the official archive {URL}")


def test_required_files_and_the_missing_ones_before_anything_starts(tree, tmp_path, capsys, monkeypatch):
    root = tree.parent
    assert required_files("tiny_imagenet", str(root)) == [tree / "wnids.txt", tree / "train",
                                                          tree / "val" / "val_annotations.txt", tree / "val" / "images"]
    assert missing_files("tiny_imagenet", str(root)) == []
    (tree / "val" / "val_annotations.txt").unlink()
    missing = (f"tiny_imagenet files missing: {tree}/val/val_annotations.txt does not exist; download {URL} and "
               f"unzip it into {root}")
    for attempt in (lambda: missing_files("tiny_imagenet", str(root)), lambda: load(tree),
                    lambda: load_config(None, ["data.dataset=tiny_imagenet", f"data.root={root}"])):
        with pytest.raises(ConfigError) as raised:
            attempt()
        assert_error(raised, missing)
    with pytest.raises(ConfigError) as raised:
        load_dataset("tiny_imagenet", root=str(root), download=True)
    assert_error(raised, f"data.download=true cannot fetch tiny_imagenet ({tree}/val/val_annotations.txt does not "
                         f"exist); download {URL} and unzip it into {root}")
    empty = tmp_path / "empty"
    monkeypatch.chdir(tmp_path)
    assert main(["run", "data.dataset=tiny_imagenet", f"data.root={empty}", "--out", "out"]) == 2
    assert capsys.readouterr().err == (f"rayfed: error: tiny_imagenet files missing: {empty}/tiny-imagenet-200/"
                                       f"wnids.txt does not exist; download {URL} and unzip it into {empty}\n")
    assert not (tmp_path / "out").exists()


def test_config_resolves_to_resnet20_and_dirichlet_and_refuses_fedmos(tree):
    config = load_config(None, ["data.dataset=tiny_imagenet", f"data.root={tree.parent}"])
    assert config.model.name == "resnet20" and config.data.partition == "dirichlet"
    with pytest.raises(ConfigError) as raised:
        load_config(None, ["data.dataset=tiny_imagenet", f"data.root={tree.parent}", "data.partition=fedmos"])
    assert_error(raised, "data.partition=fedmos does not apply to data.dataset=tiny_imagenet, which takes "
                         "data.partition=iid or dirichlet or feddyn or moon or shards")


def test_a_short_run_with_resnet20_and_augmentation(tree, tmp_path):
    config = load_config(None, ["data.dataset=tiny_imagenet", f"data.root={tree.parent}", "data.augment=true",
                                "data.num_clients=4", "train.clients_per_round=2", "train.rounds=2",
                                "train.local_steps=2", "train.batch_size=8", "engine.backend=local"])
    result = rayfed.run(config, run_dir=tmp_path / "run", progress=False)
    assert result.summary["rounds_completed"] == 2 and np.isfinite(result.history[-1]["test_loss"])
