"""experiments/gradma/rank_agreement.py: the committed rank_agreement.md is what the script writes from the
committed study tables, and its one-left-out range names the method whose removal moves Kendall's tau most."""
from pathlib import Path

import pytest

from tests.scripts import load_script

SCRIPT = Path(__file__).parents[1] / "experiments" / "gradma" / "rank_agreement.py"


@pytest.fixture(scope="module")
def rank_agreement():
    return load_script(SCRIPT, "rank_agreement")


def test_the_committed_file_is_the_scripts_output_from_the_committed_tables(rank_agreement):
    assert rank_agreement.render() == (SCRIPT.parent / "rank_agreement.md").read_text()


def test_one_left_out_names_the_outlier_that_carries_the_disagreement(rank_agreement):
    # Five methods in the paper's order, one of them placed last here: without it the order is the paper's.
    paper = {"A": 5.0, "B": 4.0, "C": 3.0, "D": 2.0, "E": 1.0}
    ours = {"A": 0.0, "B": 4.0, "C": 3.0, "D": 2.0, "E": 1.0}
    n, tau = rank_agreement.agreement(ours, paper)[:2]
    assert (n, tau) == (5, pytest.approx(0.2))
    cells = [cell.strip() for cell in rank_agreement.left_out(ours, paper).strip("| ").split("|")]
    # Leaving out any other method leaves A against three concordant pairs: tau 0, the tie broken by name.
    assert cells == ["5", "+0.20", "+0.00 without B (1.00)", "+1.00 without A (0.08)"]
