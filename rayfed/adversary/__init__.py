"""Byzantine clients (adversary.*): the attacks, one small module each, registered like a plugin's
would be, and the run's adversaries."""
from rayfed.adversary.base import ATTACK_KEYS, Adversaries, Attack, adversary_ids, register_attack
from rayfed.registry import import_submodules

import_submodules(__name__, __path__)

__all__ = ["ATTACK_KEYS", "Adversaries", "Attack", "adversary_ids", "register_attack"]
