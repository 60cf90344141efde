"""engine.server=driver: the ray engine's server in the driver's process gives the bits of the
local engine and of a server actor, survives its workers' deaths the same way, and is refused
where it cannot do what a server actor does."""
import pytest
import torch

import rayfed
from rayfed.errors import ConfigError
from tests.test_engine_equivalence import ON_RAY, SYNTHETIC_MLP, assert_same_run, run

DRIVER = [*ON_RAY, "engine.num_workers=2", "engine.server=driver"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [
    # Client state; 60 inputs x 2000 + 2000 x 10 floats: a broadcast above 100 KiB is stored once for both workers.
    ["algorithm.name=scaffold", "model.hidden_sizes=[2000]"],
    ["algorithm.name=fedgate"],                  # the server's reply, after each step
    ["algorithm.name=fedmos", "algorithm.lr_local=0.05", "selection.selector=cacs", "selection.cacs_warmup_rounds=2",
     "selection.cacs_clusters=4"],               # the selector's warm-up, before round 0
])
def test_a_server_in_the_driver_gives_the_bits_of_the_local_engine(tmp_path, ray_cluster, algorithm):
    overrides = SYNTHETIC_MLP + algorithm
    reference = run(tmp_path, overrides + ["engine.backend=local"], "local")
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        driver = run(tmp_path, overrides + DRIVER, "driver")
        # The server ran with engine.worker_cpus threads; the driver has its own back.
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)
    assert_same_run(reference, driver)
    assert reference.summary["client_state_bytes"] == driver.summary["client_state_bytes"]
    # Its PSS is the driver's: the run has no server process.
    assert {"driver", "worker 0", "worker 1"} <= set(driver.summary["pss_by_process"])
    assert "server" not in driver.summary["pss_by_process"]


@pytest.mark.slow
def test_with_a_server_in_the_driver_a_dead_worker_replays_to_the_uninterrupted_bits(tmp_path, capsys, ray_cluster):
    """The worker dies handing over its states for the round-4 checkpoint: the driver's server goes back
    to the round-2 checkpoint with the workers."""
    base = SYNTHETIC_MLP + ["algorithm.name=mifa", "train.rounds=6", "train.eval_every=3", "train.checkpoint_every=2"]
    whole = run(tmp_path, base + ["engine.backend=local"], "whole")
    replayed = run(tmp_path, base + DRIVER + ["engine.worker_loss=replay",
                                              "engine.fault_injection=['kill:1:4:checkpoint']"], "replayed")
    assert_same_run(whole, replayed)
    assert ("rayfed: worker 1 died in round 4; went back to the checkpoint of round 2 and running the rounds since "
            "again (engine.worker_loss=replay)\n") in capsys.readouterr().err


@pytest.mark.slow
def test_with_a_server_in_the_driver_a_dead_worker_s_clients_are_that_round_s_losses(tmp_path, ray_cluster):
    history = run(tmp_path, SYNTHETIC_MLP + DRIVER + ["algorithm.name=mifa", "train.rounds=5", "train.checkpoint_every=2",
                                                      "engine.fault_injection=['kill:1:3']"], "run").history
    assert len(history) == 5
    assert history[2]["failed_workers"] == {"1": "died"}
    assert history[2]["num_lost"] > 0 and history[2]["num_participants"] == 7 - history[2]["num_lost"]
    assert history[2]["client_states_after_restart"] == "restored from the checkpoint of round 2"


@pytest.mark.parametrize("overrides, message", [
    (DRIVER + ["engine.fault_injection=['kill_server:2']"],
     "engine.fault_injection entry 'kill_server:2' kills the server, which engine.server=driver runs in the driver's "
     "own process; set engine.server=actor to test a server death"),
    (["engine.backend=local", "engine.server=driver"],
     "engine.server=driver needs engine.backend=ray: the local engine has no actors to place or lose"),
])
def test_what_a_server_in_the_driver_cannot_do_is_refused(overrides, message):
    with pytest.raises(ConfigError) as refused:
        rayfed.load_config(None, SYNTHETIC_MLP + overrides)
    assert str(refused.value) == message
