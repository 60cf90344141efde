"""Speeds, round policies and the virtual clock: who is sampled, who straggles, and clock values."""
import math

import numpy as np
import pytest
import torch

import rayfed
from rayfed.preflight import load_config
from rayfed.engine.worker import ClientWorker
from rayfed.models import FlatModel, build_model
from rayfed.errors import ConfigError
from rayfed.systems.clients import make_client_systems
from rayfed.systems.policy import plan_round
from rayfed.systems.speeds import make_speeds
from tests.test_server import fake_results, step_with_zero_uploads
from tests.test_server import make_server as make_test_server

BASE = ["engine.backend=local", "data.num_clients=20", "train.clients_per_round=5", "train.rounds=6",
        "train.eval_every=3", "model.name=mlp", "model.hidden_sizes=[4]", "systems.step_time_spread=1.0"]


def test_policies_on_hand_made_durations():
    sampled, durations = np.array([7, 3, 9, 1]), np.array([4.0, 1.0, 9.0, 1.0])
    sync = plan_round("sync", sampled, durations, clients_per_round=3, deadline_s=None)
    assert (sync.participants, sync.stragglers, sync.round_time_s) == ([7, 3, 9, 1], [], 9.0)
    deadline = plan_round("deadline", sampled, durations, clients_per_round=3, deadline_s=4.0)
    assert (deadline.participants, deadline.stragglers, deadline.round_time_s) == ([7, 3, 1], [9], 4.0)
    early = plan_round("deadline", sampled, durations, clients_per_round=3, deadline_s=100.0)
    assert (early.participants, early.round_time_s) == ([7, 3, 9, 1], 9.0)        # done before the deadline
    fastest = plan_round("overcommit", sampled, durations, clients_per_round=2, deadline_s=None)
    assert (fastest.participants, fastest.stragglers, fastest.round_time_s) == ([3, 1], [7, 9], 1.0)
    nobody = plan_round("deadline", sampled, durations, clients_per_round=3, deadline_s=0.5)
    assert (nobody.participants, nobody.round_time_s) == ([], 0.5)


def test_speeds_are_log_normal_around_their_medians_and_fixed_per_seed():
    speeds = make_speeds(20000, 3, step_time_s=0.2, step_time_spread=0.5, upload_bps=1e6, download_bps=4e6,
                         bandwidth_spread=0.0)
    assert np.median(speeds.step_time_s) == pytest.approx(0.2, rel=0.03)
    assert np.log(speeds.step_time_s).std() == pytest.approx(0.5, rel=0.03)
    assert np.all(speeds.upload_bps == 1e6) and np.all(speeds.download_bps == 4e6)
    again = make_speeds(20000, 3, step_time_s=0.2, step_time_spread=0.5, upload_bps=1e6, download_bps=4e6,
                        bandwidth_spread=0.0)
    assert np.array_equal(speeds.step_time_s, again.step_time_s)
    durations = speeds.round_durations(np.array([0, 5]), 4, down_bytes=8e6, up_bytes=2e6)
    assert np.allclose(durations, 2.0 + 4 * speeds.step_time_s[[0, 5]] + 2.0)


def make_server(*extra):
    """test_server's Server, with log-normal step times so that clients differ in speed."""
    return make_test_server("systems.step_time_spread=1.0", *extra)


def expected_durations(config, server, clients):
    speeds = make_client_systems(config).speeds
    model_bytes = 4 * (server.model.num_params + server.buffers.numel())
    return speeds.round_durations(np.array(clients), config.train.local_steps, model_bytes, model_bytes)


def test_deadline_rounds_drop_late_clients_and_advance_the_clock_to_the_deadline():
    config, server = make_server("train.round_policy=deadline", "train.deadline_s=0.35")
    clock = 0.0
    for round in range(6):
        plan = server.sample(round)
        participants, sampled = plan.participants, plan.sampled
        durations = expected_durations(config, server, sampled)
        assert participants == [c for c, t in zip(sampled, durations) if t <= 0.35]
        metrics, _ = step_with_zero_uploads(server, round, plan)
        clock += min(0.35, durations.max())
        assert metrics["virtual_time_s"] == pytest.approx(clock)
        assert (metrics["num_sampled"], metrics["num_participants"], metrics["num_stragglers"]) == \
            (5, len(participants), 5 - len(participants))
        assert metrics["bytes_down"] == 5 * 4 * (server.model.num_params + server.buffers.numel())


def test_overcommit_samples_more_and_keeps_the_first_to_finish():
    config, server = make_server("train.round_policy=overcommit", "train.overcommit=0.5")
    plan = server.sample(0)
    participants, sampled = plan.participants, plan.sampled
    assert len(sampled) == math.ceil(5 * 1.5) == 8 and len(participants) == 5
    durations = dict(zip(sampled, expected_durations(config, server, sampled)))
    assert max(durations[c] for c in participants) <= min(durations[c] for c in plan.stragglers)
    assert plan.round_time_s == max(durations[c] for c in participants)


def test_only_online_clients_are_sampled_and_a_short_supply_is_taken_whole():
    config, server = make_server("systems.availability=bernoulli", "systems.online_probability=0.2")
    short_rounds = 0
    for round in range(40):
        online = set(np.flatnonzero(server.clock.availability.online(round, server.virtual_time_s)))
        plan = server.sample(round)
        participants = plan.participants
        assert set(participants) <= online and len(participants) == min(5, len(online))
        short_rounds += len(online) < 5
        step_with_zero_uploads(server, round, plan)
    assert short_rounds > 0


def test_memory_algorithms_see_exactly_who_participated():
    config, server = make_server("algorithm.name=gradma_s", "algorithm.memory_size=20",
                                 "train.round_policy=deadline", "train.deadline_s=0.3")
    everyone = set()
    for round in range(6):
        plan = server.sample(round)
        participants = plan.participants
        everyone |= set(participants)
        if participants:
            server.step(round, plan, fake_results(server, participants, lambda c, b: torch.zeros(b)))
        assert set(server.state.memory.buffered) == everyone
    assert everyone and len(everyone) < 20


def test_a_huge_deadline_is_sync(tmp_path):
    sync = rayfed.run(load_config(None, BASE), run_dir=tmp_path / "sync", progress=False)
    deadline = rayfed.run(load_config(None, BASE + ["train.round_policy=deadline", "train.deadline_s=1e9"]),
                          run_dir=tmp_path / "deadline", progress=False)
    assert torch.equal(sync.params, deadline.params)
    assert [m["virtual_time_s"] for m in sync.history] == [m["virtual_time_s"] for m in deadline.history]
    assert all(m["num_stragglers"] == 0 for m in deadline.history)


def test_stragglers_are_never_trained_and_upload_nothing(tmp_path, monkeypatch):
    trained = []
    train_client = ClientWorker._train_client

    def recording(self, round, client_id, tensors, buffers, seed):
        trained.append(round)
        return train_client(self, round, client_id, tensors, buffers, seed)

    monkeypatch.setattr(ClientWorker, "_train_client", recording)
    result = rayfed.run(load_config(None, BASE + ["train.round_policy=deadline", "train.deadline_s=0.3"]),
                        run_dir=tmp_path / "d", progress=False)
    model = FlatModel(build_model("mlp", (60,), 10, [4]))
    upload_bytes = 4 * (model.num_params + model.buffers.numel())
    assert sum(m["num_stragglers"] for m in result.history) > 0
    for round, metrics in enumerate(result.history):
        assert trained.count(round) == metrics["num_participants"]
        assert metrics["num_participants"] + metrics["num_stragglers"] == metrics["num_sampled"] == 5
        assert metrics["bytes_up"] == metrics["num_participants"] * upload_bytes


@pytest.mark.parametrize("overrides, message", [
    (["train.round_policy=deadline"], "train.round_policy=deadline needs train.deadline_s > 0"),
    (["train.deadline_s=5"], "train.deadline_s is only used with train.round_policy=deadline"),
    (["train.round_policy=fastest"], "train.round_policy='fastest' is not one of"),
    (["systems.step_time_spread=-1"], "systems.step_time_spread=-1.0 must be >= 0"),
    (["train.overcommit=-0.1"], "train.overcommit=-0.1 must be >= 0"),
])
def test_systems_configuration_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


ASYNC = ["train.round_policy=async_buffered"]


def test_fedbuff_with_buffer_and_concurrency_s_and_no_staleness_is_sync_fedavg(tmp_path):
    sync = rayfed.run(load_config(None, BASE + ["algorithm.name=fedavg"]), run_dir=tmp_path / "s", progress=False)
    fedbuff = rayfed.run(load_config(None, BASE + ASYNC + ["algorithm.name=fedavg", "train.buffer_size=5",
                                                           "train.concurrency=5"]),
                         run_dir=tmp_path / "b", progress=False)
    assert torch.equal(sync.params, fedbuff.params)
    assert [m["virtual_time_s"] for m in sync.history] == [m["virtual_time_s"] for m in fedbuff.history]
    assert all(m["staleness_max"] == 0 for m in fedbuff.history)


def test_fedbuff_updates_every_buffer_size_arrivals_from_stale_versions():
    config, server = make_server(*ASYNC, "train.buffer_size=3", "train.concurrency=8")
    arrival_times = {}
    for round in range(6):
        plan = server.sample(round)
        launched = plan.participants
        assert len(set(launched) & set(arrival_times)) == 0                 # nobody is launched twice at once
        durations = expected_durations(config, server, launched)
        arrival_times.update({c: server.virtual_time_s + t for c, t in zip(launched, durations)})
        in_flight_before = sorted(arrival_times.items(), key=lambda item: item[1])
        metrics, _ = server.step(round, plan, *([fake_results(server, launched, lambda c, b: torch.zeros(b))]
                                       if launched else []))
        expected = in_flight_before[:3]
        assert plan.sampled == launched and metrics["num_participants"] == 3
        assert metrics["virtual_time_s"] == pytest.approx(expected[-1][1])
        assert metrics["num_in_flight"] == 8 - 3
        for client, _ in expected:
            del arrival_times[client]
    assert metrics["staleness_max"] > 0


def test_staleness_weight_scales_stale_updates():
    plain = make_server(*ASYNC, "train.buffer_size=2", "train.concurrency=6", "algorithm.name=fedavg")[1]
    weighted = make_server(*ASYNC, "train.buffer_size=2", "train.concurrency=6", "algorithm.name=fedavg",
                           "train.staleness_weight=sqrt")[1]
    for round in range(4):
        for server in (plain, weighted):
            plan = server.sample(round)
            launched = plan.participants
            metrics, _ = server.step(round, plan, *([fake_results(server, launched, lambda c, b: torch.zeros(b))]
                                                    if launched else []))
        if metrics["staleness_max"] == 0:
            assert torch.equal(plain.global_params(), weighted.global_params())
    assert metrics["staleness_max"] > 0
    assert not torch.equal(plain.global_params(), weighted.global_params())


@pytest.mark.parametrize("selector", ["uniform", "md", "acs", "ucs"])
def test_nobody_online_makes_the_server_wait_instead_of_stalling(selector):
    """Under every selector, the weighting ones included: nobody is drawn and the server's clock moves on."""
    config, server = make_server("systems.availability=markov", "systems.mean_online_s=10",
                                 "systems.mean_offline_s=100000", f"selection.selector={selector}")
    times = []
    for round in range(3):
        plan = server.sample(round)
        assert plan.participants == []
        step_with_zero_uploads(server, round, plan)
        times.append(server.virtual_time_s)
    assert times[0] > 0 and times[0] < times[1] < times[2]


@pytest.mark.parametrize("overrides, message", [
    (["train.concurrency=5"], "train.concurrency is only used with train.round_policy=async_buffered"),
    (ASYNC + ["train.buffer_size=6", "train.concurrency=5"], "needs 1 <= train.buffer_size"),
    (ASYNC + ["train.staleness_weight=sqrt", "algorithm.name=mifa"], "mifa uploads something else"),
])
def test_async_configuration_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, BASE + overrides)


def test_a_speed_trace_overrides_the_listed_clients(tmp_path):
    trace = tmp_path / "speeds.csv"
    trace.write_text("client_id,step_time_s,upload_bps,download_bps\n3,2.5,1000,2000\n\n7,0.1,5e6,1e7\n")
    base = make_speeds(10, 0, step_time_s=0.2, step_time_spread=0.5, upload_bps=1e6, download_bps=1e7,
                       bandwidth_spread=0.3)
    traced = make_speeds(10, 0, step_time_s=0.2, step_time_spread=0.5, upload_bps=1e6, download_bps=1e7,
                         bandwidth_spread=0.3, speed_trace=str(trace))
    assert (traced.step_time_s[3], traced.upload_bps[3], traced.download_bps[3]) == (2.5, 1000.0, 2000.0)
    assert (traced.step_time_s[7], traced.upload_bps[7]) == (0.1, 5e6)
    others = [0, 1, 2, 4, 5, 6, 8, 9]
    assert np.array_equal(traced.step_time_s[others], base.step_time_s[others])


@pytest.mark.parametrize("body, fragment", [
    ("client_id,step_time,upload_bps,download_bps\n1,1,1,1\n", "line 1: the header is"),
    ("client_id,step_time_s,upload_bps,download_bps\n1,1,1\n", "line 2: 3 fields, expected 4"),
    ("client_id,step_time_s,upload_bps,download_bps\n1,0,1,1\n", "line 2: step_time_s, upload_bps and download_bps"),
    ("client_id,step_time_s,upload_bps,download_bps\n10,1,1,1\n", "line 2: client_id 10 exceeds data.num_clients=10"),
    ("client_id,step_time_s,upload_bps,download_bps\n1,1,1,1\n1,2,2,2\n", "line 3: client_id 1 is listed twice"),
    ("client_id,step_time_s,upload_bps,download_bps\n1,fast,1,1\n", "line 2: step_time_s 'fast' is not a number"),
])
def test_malformed_speed_traces_name_the_file_and_line(tmp_path, body, fragment):
    trace = tmp_path / "speeds.csv"
    trace.write_text(body)
    with pytest.raises(ConfigError, match="systems.speed_trace=") as error:
        make_speeds(10, 0, step_time_s=0.2, step_time_spread=0.0, upload_bps=1e6, download_bps=1e7,
                    bandwidth_spread=0.0, speed_trace=str(trace))
    assert str(trace) in str(error.value) and fragment in str(error.value)
