"""experiments/fedmos/rounds_to_target.py's --grid: each method's rate is picked on the tuning seeds
alone, by the fewest rounds to the loss target (median; never after any number), ties to the lower mean
final training loss, and the reported seeds may not be tuning seeds."""
import math
from pathlib import Path

import pytest

from tests.scripts import load_script

SCRIPT = Path(__file__).parents[1] / "experiments" / "fedmos" / "rounds_to_target.py"


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT, "rounds_to_target")


def curve(losses):
    return [{"round": r + 1, "global_train_loss": loss, "test_accuracy": 0.5} for r, loss in enumerate(losses)]


def test_the_rate_with_the_fewest_median_rounds_wins_and_ties_go_to_the_lower_final_loss(script, monkeypatch):
    curves = {  # (lr, seed) -> losses per round; the loss target is 1.0
        ("0.01", 3): [2, 2, 0.9], ("0.01", 4): [2, 0.9, 0.8],        # rounds 3, 2: median 2.5
        ("0.1", 3): [2, 0.9, 0.5], ("0.1", 4): [0.9, 0.9, 0.7],      # rounds 2, 1: median 1.5, final 0.6
        ("0.2", 3): [0.9, 0.9, 0.4], ("0.2", 4): [2, 0.9, 0.4],      # rounds 1, 2: median 1.5, final 0.4
        ("0.5", 3): [0.5, math.nan, math.nan], ("0.5", 4): [2, 2, 2],  # a diverged seed and a never
    }
    asked = []

    def run_method(scenario, method, seed, overrides, out, lr=None):
        asked.append((lr, seed))
        return curve(curves[lr, seed])

    monkeypatch.setattr(script, "run_method", run_method)
    picked, scores = script.tune(Path("s.yaml"), "FedAvg (UCS)", ["0.01", "0.1", "0.2", "0.5"], [3, 4], [],
                                 Path("out"), loss_target=1.0)
    assert picked == "0.2"
    assert {lr: score["rounds_per_seed"] for lr, score in scores.items()} == {
        "0.01": [3, 2], "0.1": [2, 1], "0.2": [1, 2], "0.5": [1, None]}
    assert scores["0.5"]["median"] is None
    assert {seed for _, seed in asked} == {3, 4}


def test_tuning_seeds_that_are_reported_seeds_are_refused(script, capsys):
    with pytest.raises(SystemExit) as stopped:
        script.main(["experiments/fedmos/digits.yaml", "--seeds", "3", "--grid", "0.01", "--tune-seeds", "2", "3"])
    assert stopped.value.code == 2
    assert "--tune-seeds [2, 3] overlap the reported seeds 0..2" in capsys.readouterr().err
