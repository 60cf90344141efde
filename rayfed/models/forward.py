"""A model's forward passes as local objectives need them: its penultimate representation
(MOON's contrastive term), its blocks (FedMLB's hybrid pathways), and the same passes at a parameter
vector other than the one being trained (a frozen copy of the global or a previous model).

A model is an `nn.Sequential` whose children run one after another. Its representation is the
input of its last child (the classifier) unless `with_structure` says otherwise; it has blocks
where `with_structure` declares them. A frozen pass runs the same module through
`torch.func.functional_call` with tensors of the other vector, so no copy of the model is kept
and no gradient reaches those parameters; gradients still flow to the pass's inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn
from torch.func import functional_call

from rayfed.errors import ConfigError


@dataclass(frozen=True)
class Structure:
    block_starts: tuple[int, ...]    # the child index where each block begins; the first is 0
    features_at: int                 # the representation is the output of children [0, features_at)


def with_structure(model: nn.Sequential, block_starts: tuple[int, ...] = (),
                   features_at: int | None = None) -> nn.Sequential:
    """Declares `model`'s blocks (children index where each begins, the first 0) and where its
    representation is taken (default: the input of its last child); returns the model."""
    size = len(model)
    features_at = size - 1 if features_at is None else features_at
    starts = tuple(block_starts)
    if starts and (starts[0] != 0 or list(starts) != sorted(set(starts)) or starts[-1] >= size):
        raise ConfigError(f"block starts {starts} must rise from 0 and stay below the model's {size} children")
    if not 0 < features_at < size:
        raise ConfigError(f"features_at={features_at} must lie between 1 and {size - 1}")
    model.rayfed_structure = Structure(starts, features_at)
    return model


def structure_of(module: nn.Module, name: str = "this model") -> Structure:
    """The declared structure of `module` (a Sequential without a declaration: no blocks, the
    representation at its last child); one line naming the model when it is not a Sequential."""
    declared = getattr(module, "rayfed_structure", None)
    if declared is not None:
        return declared
    if not isinstance(module, nn.Sequential) or len(module) < 2:
        raise ConfigError(f"{name} is not an nn.Sequential of two or more children, so it has no representation "
                          f"or blocks to take (see rayfed.models.forward.with_structure)")
    return Structure((), len(module) - 1)


def structure_problem(module: nn.Module, needs: str, name: str) -> str | None:
    """Why model `name` cannot give what a local objective `needs` ("features" or "blocks"), or None."""
    try:
        structure = structure_of(module, f"model.name={name}")
    except ConfigError as error:
        return str(error)
    if needs == "blocks" and len(structure.block_starts) < 2:
        return (f"model.name={name} declares {len(structure.block_starts)} blocks, and two or more are needed "
                f"(see rayfed.models.forward.with_structure)")
    return None


class ModelForward:
    """Forward passes of one Sequential model at one parameter vector: the trained one (`tensors`
    None: the module's own parameters, whose gradients fill the client's gradient) or a frozen one
    (`tensors`: every parameter and buffer by name). A frozen pass runs in eval mode (running
    statistics, no dropout: MOON's frozen models) unless `train`, where it uses batch statistics
    and dropout as the trained model does (FedMLB's frozen global blocks) without touching the
    trained model's running statistics."""

    def __init__(self, module: nn.Sequential, structure: Structure, tensors: dict[str, Tensor] | None = None,
                 train: bool = True):
        self.module = module
        self.structure = structure
        self.train = train
        # functional_call takes only the names of the children it runs: the tensors by child.
        self.tensors_by_child: list[dict[str, Tensor]] | None = None
        if tensors is not None:
            self.tensors_by_child = [{} for _ in module]
            for name, tensor in tensors.items():
                self.tensors_by_child[int(name.split(".", 1)[0])][name] = tensor

    @property
    def num_blocks(self) -> int:
        return len(self.structure.block_starts)

    def __call__(self, inputs: Tensor) -> Tensor:
        """The logits."""
        return self._run(inputs, 0, len(self.module))

    def features(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        """(representation, logits) in one pass."""
        features = self._run(inputs, 0, self.structure.features_at)
        return features, self._run(features, self.structure.features_at, len(self.module))

    def block_outputs(self, inputs: Tensor) -> list[Tensor]:
        """The output of every block in one pass; the last is the logits."""
        bounds = self._block_bounds()
        outputs = []
        for start, stop in zip(bounds, bounds[1:]):
            inputs = self._run(inputs, start, stop)
            outputs.append(inputs)
        return outputs

    def through_blocks(self, inputs: Tensor, first: int) -> Tensor:
        """Blocks `first`, first + 1, ... (0-based) run on `inputs`, the output of block first - 1: the logits."""
        return self._run(inputs, self._block_bounds()[first], len(self.module))

    def _block_bounds(self) -> list[int]:
        if not self.structure.block_starts:
            raise ConfigError("this model declares no blocks (see rayfed.models.forward.with_structure)")
        return [*self.structure.block_starts, len(self.module)]

    def _run(self, inputs: Tensor, start: int, stop: int) -> Tensor:
        children = self.module[start:stop]
        if self.tensors_by_child is None:
            return children(inputs)
        tensors = self._tensors(start, stop)
        if self.train:
            return functional_call(children, tensors, (inputs,))
        self.module.eval()
        try:
            return functional_call(children, tensors, (inputs,))
        finally:
            self.module.train()

    def _tensors(self, start: int, stop: int) -> dict[str, Tensor]:
        """The tensors of children [start, stop) by name, for a frozen pass."""
        return {name: tensor for child in self.tensors_by_child[start:stop] for name, tensor in child.items()}
