"""Label flipping (Fang, Cao, Jia, Gong, USENIX Security 2020, arXiv:1911.11815): an adversary
trains on its own samples with each label l replaced by L - l - 1 (L classes) and uploads what that
training gives; its upload is not changed afterwards."""
from __future__ import annotations

from torch import Tensor

from rayfed.adversary.base import Attack, register_attack


class LabelFlip(Attack):
    poisons_labels = True

    def labels(self, labels: Tensor, num_classes: int) -> Tensor:
        return (num_classes - 1) - labels


@register_attack("label_flip")
def label_flip(adversary) -> LabelFlip:
    """Each adversary trains on labels l -> L - l - 1 (Fang et al., USENIX Security 2020)."""
    return LabelFlip()
