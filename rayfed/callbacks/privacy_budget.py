"""`train.target_epsilon`: the run ends before the round that would take the privacy it has spent
(privacy.*, as its accountant computes it) above the budget. A round's epsilon does not depend on
the data, so the last round within the budget is known before the run starts."""
from __future__ import annotations

from rayfed.callbacks.base import Callback, RunView, Stop

PRIVACY_BUDGET_SPENT = "privacy_budget_spent"


def last_round_within(config) -> tuple:
    """The most rounds of the config's run whose epsilon is at most train.target_epsilon, and its accountant."""
    from rayfed.privacy import event_of
    from rayfed.privacy.accountant import Accountant
    privacy = config.privacy
    accountant = Accountant(privacy.accountant, event_of(config, privacy.noise_multiplier), privacy.delta)
    return accountant.last_round_within(config.train.target_epsilon, config.train.rounds), accountant


class PrivacyBudget(Callback):
    def __init__(self, config):
        self.budget = config.train.target_epsilon
        self.rounds = config.train.rounds
        self.last, self.accountant = last_round_within(config)

    def on_round_end(self, run: RunView, record: dict) -> Stop | None:
        if record["round"] < self.last or self.last >= self.rounds:
            return None
        spent, next_round = self.accountant.epsilon(self.last), self.accountant.epsilon(self.last + 1)
        return Stop(f"round {self.last + 1} would take epsilon to {next_round:.4g}, above train.target_epsilon="
                    f"{self.budget} (after round {self.last}: {spent:.4g} at delta={self.accountant.delta:g})",
                    PRIVACY_BUDGET_SPENT)
