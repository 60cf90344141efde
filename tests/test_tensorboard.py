"""logging.tensorboard: the run directory's event files hold, read back with TensorBoard's own reader,
exactly metrics.jsonl's numeric fields, one value per round, also after rounds ran again."""
import json
import math
from collections import Counter

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

import rayfed
from rayfed.callbacks.tensorboard import EVENT_FILES, TensorBoardLog, scalars
from tests.test_checkpoint import ROUNDS, interrupted
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP

LOCAL = SYNTHETIC_MLP + ["engine.backend=local", "logging.tensorboard=true"]


def numeric_fields(record: dict, prefix: str = ""):
    """(tag, value) for the numbers of a metrics.jsonl record but its round, dicts flattened with "/"."""
    for key, value in record.items():
        if isinstance(value, dict):
            yield from numeric_fields(value, f"{prefix}{key}/")
        elif type(value) in (int, float) and key != "round":
            yield f"{prefix}{key}", value


def assert_events_are_the_metrics(run_dir, rounds: int):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["round"] for record in records] == list(range(1, rounds + 1))
    expected: dict[str, dict[int, float]] = {}
    for record in records:
        for tag, value in numeric_fields(record):
            expected.setdefault(tag, {})[record["round"]] = value
    events = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    events.Reload()
    round_tags = [tag for tag in events.Tags()["scalars"] if not tag.startswith("summary/")]
    assert sorted(round_tags) == sorted(expected)
    for tag, values in expected.items():
        read = events.Scalars(tag)
        assert [event.step for event in read] == sorted(values), tag    # one value per round, in order
        for event in read:
            assert np.float32(values[event.step]) == event.value, (tag, event.step)
    return expected


def test_event_files_hold_every_numeric_metrics_field_of_every_round(tmp_path):
    result = rayfed.run(rayfed.load_config(None, LOCAL), run_dir=tmp_path / "run", progress=False)
    expected = assert_events_are_the_metrics(result.run_dir, 4)
    assert {"train_loss", "bytes_up", "wall_time_s", "phase_s/train", "test_accuracy", "client_train_loss_max",
            "client_local_steps_min"} <= set(expected)
    assert sorted(expected["test_accuracy"]) == [2, 4]          # evaluated rounds only
    assert len(list(result.run_dir.glob(EVENT_FILES))) == 1


def test_the_hparams_tab_gets_the_config_and_the_final_and_best_accuracy(tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2
    result = rayfed.run(rayfed.load_config(None, LOCAL), run_dir=tmp_path / "run", progress=False)
    events = EventAccumulator(str(result.run_dir), size_guidance={SCALARS: 0})
    events.Reload()
    for key in ("final_test_accuracy", "best_test_accuracy", "final_test_loss"):
        [event] = events.Scalars(f"summary/{key}")
        assert (event.step, event.value) == (4, np.float32(result.summary[key]))
    hparams = {}
    for path in result.run_dir.glob(EVENT_FILES):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "_hparams_/session_start_info":
                    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    hparams = {key: getattr(item, item.WhichOneof("kind")) for key, item
                               in data.session_start_info.hparams.items()}
    config = rayfed.load_config(result.run_dir / "config.yaml")
    assert hparams["algorithm.name"] == "fedavgm" and hparams["train.rounds"] == 4
    assert hparams["model.hidden_sizes"] == "[" + ", ".join(map(str, config.model.hidden_sizes)) + "]"
    assert hparams["logging.tensorboard"] == "true" and hparams["train.target_accuracy"] == "null"
    assert len(hparams) == len(_leaves(config.to_dict()))


def _leaves(tree: dict) -> list:
    return [leaf for value in tree.values() for leaf in (_leaves(value) if isinstance(value, dict) else [value])]


@pytest.mark.parametrize("fail_at_round", [5, 6])
def test_a_resumed_run_keeps_one_value_per_round(tmp_path, monkeypatch, fail_at_round):
    """Checkpoint of round 4; interrupted while recording round 5 (nothing after the checkpoint
    written) or round 6 (round 5 written, and written again by the resume: purged)."""
    run_dir = interrupted(tmp_path, LOCAL + ROUNDS, monkeypatch, fail_at_round=fail_at_round)
    rayfed.resume(run_dir, progress=False)
    assert_events_are_the_metrics(run_dir, 7)
    written = Counter()
    for path in run_dir.glob(EVENT_FILES):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "train_loss":
                    written[event.step] += 1
    # The files themselves hold round 5 twice when it was recorded before the interruption.
    assert written == {step: 2 if step < fail_at_round and step > 4 else 1 for step in range(1, 8)}


def test_no_event_files_by_default(tmp_path):
    result = rayfed.run(rayfed.load_config(None, SYNTHETIC_MLP + ["engine.backend=local", "train.rounds=2"]),
                        run_dir=tmp_path / "run", progress=False)
    assert not list(result.run_dir.glob(EVENT_FILES)) and not list(result.run_dir.rglob("*tfevents*"))


def test_scalars_are_the_finite_numbers_with_dicts_flattened():
    record = {"round": 3, "train_loss": 0.5, "num_lost": 2, "test_loss": math.nan, "test_accuracy": None,
              "virtual_time_s": math.inf, "model_finite": False, "client_states_after_restart": "reset",
              "failed_workers": {"1": "died"}, "phase_s": {"train": 0.25, "eval": 0}, "sampled": [1, 2]}
    assert scalars(record) == {"train_loss": 0.5, "num_lost": 2.0, "phase_s/train": 0.25, "phase_s/eval": 0.0}


def train_losses(run_dir):
    events = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars("train_loss")]


def test_events_are_on_disk_each_round_and_a_file_after_a_rewind_is_read_last(tmp_path):
    log = TensorBoardLog(tmp_path)
    log.append({"round": 1, "train_loss": 1.0})
    log.append({"round": 2, "train_loss": 2.0})
    assert train_losses(tmp_path) == [(1, 1.0), (2, 2.0)]       # flushed: a killed run keeps them
    log.rewind(1)
    # The first file, renamed to sort after any file opened within the same second: the next one
    # must wait for the next second, or its round 2 would be read before the one it replaces.
    [first] = tmp_path.glob(EVENT_FILES)
    first.rename(first.with_name(".".join(first.name.split(".")[:4]) + ".~"))
    log.append({"round": 2, "train_loss": 3.0})
    log.close()
    assert train_losses(tmp_path) == [(1, 1.0), (2, 3.0)]


@pytest.mark.slow
def test_a_recreated_server_leaves_one_value_per_round(tmp_path, ray_cluster):
    """The server dies stepping round 6: the supervisor goes back to the round-4 checkpoint, and
    round 5, already written, runs again."""
    overrides = LOCAL + ROUNDS + [*ON_RAY, "engine.num_workers=2", "algorithm.name=mifa",
                                  "engine.fault_injection=['kill_server:6']"]
    result = rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "run", progress=False)
    assert result.summary["server_restarts"] == 1
    assert_events_are_the_metrics(result.run_dir, 7)
    assert len(list(result.run_dir.glob(EVENT_FILES))) == 2
