"""Client metrics: every number a client reports in its upload's metrics reaches the round's record
(`client_<name>_mean`, `_min`, `_max` over the clients that reported it) and, with
`logging.client_metrics`, clients.jsonl (one line per round and counted client), which a resume keeps
up to its checkpoint as it keeps metrics.jsonl; the same under engine.partial_sums, where the
workers send each client's metrics beside their sums."""
import json
import math

import pytest

import rayfed
from rayfed.engine.supervisor import Supervisor
from rayfed.metrics import client_fields, client_row
from tests.test_engine_equivalence import SYNTHETIC_MLP, assert_same_run, run, without_wall_clock

LOCAL = SYNTHETIC_MLP + ["engine.backend=local", "train.local_epochs=1"]
LOGGED = ["logging.client_metrics=true"]


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]


def test_the_record_aggregates_what_clients_jsonl_holds_client_by_client(tmp_path):
    result = run(tmp_path, LOCAL + LOGGED, "run")
    clients = rows(result.run_dir)
    spreads = 0
    for record in records(result.run_dir):
        mine = [row for row in clients if row["round"] == record["round"]]
        assert len(mine) == record["num_participants"] and [row["client"] for row in mine] == \
            sorted(row["client"] for row in mine)
        for row in mine:
            assert set(row) == {"round", "client", "num_samples", "train_loss", "local_steps"}
            # One epoch of batches of 16 (a last batch of one sample is skipped).
            assert row["local_steps"] == math.ceil(row["num_samples"] / 16) - (row["num_samples"] % 16 == 1)
        for name in ("train_loss", "local_steps"):
            values = [row[name] for row in mine]
            assert (record[f"client_{name}_min"], record[f"client_{name}_max"]) == (min(values), max(values))
            assert record[f"client_{name}_mean"] == pytest.approx(math.fsum(values) / len(values), rel=1e-15)
        # The fields the record had before are those means.
        assert (record["train_loss"], record["local_steps"]) == (record["client_train_loss_mean"],
                                                                 record["client_local_steps_mean"])
        spreads += record["client_local_steps_min"] < record["client_local_steps_max"]
    assert spreads == len(result.history)


def test_clients_jsonl_changes_nothing_else_and_is_written_only_when_asked_for(tmp_path):
    plain = run(tmp_path, LOCAL, "plain")
    logged = run(tmp_path, LOCAL + LOGGED, "logged")
    assert_same_run(plain, logged)
    assert not (plain.run_dir / "clients.jsonl").exists() and (logged.run_dir / "clients.jsonl").exists()
    assert {"client_train_loss_max", "client_local_steps_min"} <= set(plain.history[0])


def test_only_numbers_are_aggregated_and_a_nan_makes_all_three_nan():
    reported = [{"loss": 2.0, "steps": 3, "flag": True, "norms": [1.0, 2.0], "name": "a"},
                {"loss": 1.0, "steps": 5, "only_here": 7},
                {"loss": float("nan"), "steps": 4}]
    fields = client_fields(reported)
    assert list(fields) == [f"client_{name}_{kind}" for name in ("loss", "only_here", "steps")
                            for kind in ("mean", "min", "max")]
    assert all(math.isnan(fields[f"client_loss_{kind}"]) for kind in ("mean", "min", "max"))
    assert (fields["client_steps_mean"], fields["client_steps_min"], fields["client_steps_max"]) == (4.0, 3, 5)
    assert type(fields["client_steps_min"]) is int
    assert (fields["client_only_here_mean"], fields["client_only_here_min"]) == (7.0, 7)
    assert client_row(3, 8, 40, {**reported[0], "round": 99}) == {"round": 3, "client": 8, "num_samples": 40,
                                                                 "loss": 2.0, "steps": 3}


class InterruptAt(rayfed.Callback):
    """Interrupts the run once round `round`'s lines are written (after the checkpoint of round 4)."""

    def __init__(self, round: int):
        self.round = round

    def on_round_end(self, run, record):
        if record["round"] == self.round:
            raise KeyboardInterrupt


def test_a_resume_keeps_clients_jsonl_up_to_its_checkpoint_and_ends_as_an_uninterrupted_run(tmp_path):
    overrides = LOCAL + LOGGED + ["train.rounds=7", "train.checkpoint_every=2"]
    whole = run(tmp_path, overrides, "whole")
    config = rayfed.load_config(None, overrides)
    with pytest.raises(KeyboardInterrupt):
        rayfed.run(config, run_dir=tmp_path / "cut", progress=False, callbacks=[InterruptAt(5)])
    assert max(row["round"] for row in rows(tmp_path / "cut")) == 5        # round 5's rows, after the checkpoint
    resumed = rayfed.resume(tmp_path / "cut", progress=False)
    assert_same_run(whole, resumed)
    assert (tmp_path / "cut" / "clients.jsonl").read_bytes() == (whole.run_dir / "clients.jsonl").read_bytes()


def test_a_resume_drops_a_line_a_crash_cut_short(tmp_path):
    overrides = LOCAL + LOGGED + ["train.rounds=7", "train.checkpoint_every=2"]
    whole = run(tmp_path, overrides, "whole")
    with pytest.raises(KeyboardInterrupt):
        rayfed.run(rayfed.load_config(None, overrides), run_dir=tmp_path / "cut", progress=False,
                   callbacks=[InterruptAt(5)])
    written = (tmp_path / "cut" / "clients.jsonl").read_bytes()
    (tmp_path / "cut" / "clients.jsonl").write_bytes(written[:-7])
    rayfed.resume(tmp_path / "cut", progress=False)
    assert (tmp_path / "cut" / "clients.jsonl").read_bytes() == (whole.run_dir / "clients.jsonl").read_bytes()


def test_a_run_that_fails_before_its_first_round_leaves_no_clients_jsonl(tmp_path, monkeypatch):
    def broken(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(Supervisor, "run", broken)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="boom"):
        rayfed.run(rayfed.load_config(None, LOCAL + LOGGED), run_dir=tmp_path / "empty", progress=False)
    assert list((tmp_path / "empty").iterdir()) == []


def test_under_partial_sums_the_workers_still_send_each_clients_metrics(tmp_path):
    """The uploads travel summed, the metrics one per client: round 1 (from the same model) has the
    per-client path's rows, and every round its clients and step counts."""
    overrides = LOCAL + LOGGED + ["algorithm.agg_weighting=num_samples"]
    per_client = run(tmp_path, overrides, "per_client")
    summed = run(tmp_path, overrides + ["engine.partial_sums=true"], "summed")
    plain, partial = rows(per_client.run_dir), rows(summed.run_dir)
    assert [row for row in partial if row["round"] == 1] == [row for row in plain if row["round"] == 1]
    kept = ("round", "client", "num_samples", "local_steps")
    assert [{key: row[key] for key in kept} for row in partial] == [{key: row[key] for key in kept} for row in plain]
    assert json.loads(without_wall_clock(summed.history[:1])) == json.loads(without_wall_clock(per_client.history[:1]))
