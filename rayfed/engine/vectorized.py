"""Training a worker's clients of a round as one batched computation (engine.vectorize).

ClientBatchTask implements the ClientTask protocol with a leading client dimension: parameters
are (clients, d), a batch is every client's next minibatch stacked, and the gradient is taken
per client with torch.func.vmap. An algorithm whose local step is written with broadcasting
ops (FedAvgM's local_sgd) then trains all clients at once, unchanged. Each client keeps its own
parameters, minibatch stream, sample count, BatchNorm running statistics and dropout stream, so
results equal sequential training up to floating-point reordering inside the batched kernels (BatchNorm
and dropout models batch only where every client holds the same number of samples).
"""
from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.utils.rnn import pad_sequence

from rayfed.algorithms.base import Algorithm
from rayfed.engine.pack import current_member
from rayfed.models import FlatModel

# Samples per forward pass of a full local gradient: bounds its memory whatever a client holds.
FULL_GRADIENT_CHUNK = 1024


def vectorize_blocker(algorithm_name: str, algorithm: Algorithm, module: nn.Module,
                      steps_differ_between_clients: bool = False,
                      sizes_differ_between_clients: bool = False) -> str | None:
    """Why this algorithm and model cannot train clients as one batch; None when they can."""
    if not algorithm.vectorizable:
        return f"algorithm {algorithm_name} has no batched local step (it does not declare vectorizable)"
    if steps_differ_between_clients:
        return ("local epochs give this partition's clients different numbers of local steps, which one "
                "batched computation does not take")
    layers = sorted({type(layer).__name__ for layer in module.modules() if _unbatchable(layer)})
    if layers:
        return (f"the model has {', '.join(layers)} layers, whose per-client statistics and random streams "
                f"a batched computation does not reproduce")
    sized = sorted({type(layer).__name__ for layer in module.modules()
                    if isinstance(layer, (nn.modules.batchnorm._BatchNorm, nn.Dropout))})
    if sized and sizes_differ_between_clients:
        return (f"the model's {', '.join(sized)} layers need every client's minibatch of one size (BatchNorm's "
                f"statistics would count padding rows, and dropout would draw masks for them): this partition's "
                f"clients hold different numbers of samples")
    return None


def _unbatchable(layer: nn.Module) -> bool:
    """Normalisation other than BatchNorm with a running average, and dropout other than nn.Dropout's
    element-wise masks (Dropout2d's masks are per channel): BatchedModule rebuilds neither."""
    if isinstance(layer, nn.modules.batchnorm._BatchNorm):
        return layer.momentum is None        # a cumulative average counts batches across clients
    if isinstance(layer, nn.modules.batchnorm._NormBase):
        return True
    return isinstance(layer, nn.modules.dropout._DropoutNd) and type(layer) is not nn.Dropout


@dataclass
class Layout:
    """What one pass calls, in call order: each dropout call's (rate, shape of one client's activations)
    and the index (in BatchedModule.running) of each call of a BatchNorm layer that keeps running statistics."""

    dropouts: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    norms: list[int] = field(default_factory=list)


class PassState:
    """What the rebuilt layers of one model share during a pass: the dropout masks still to apply and the
    batch statistics reported so far, both in call order; while `layout` is set (a probe on the meta
    device), the layers record what they are called with there instead."""

    def __init__(self):
        self.masks: deque[Tensor] = deque()
        self.statistics: list[tuple[Tensor, Tensor]] = []
        self.layout: Layout | None = None


class BatchStatistics(nn.Module):
    """A BatchNorm layer in train mode that normalises with its batch's statistics and reports them
    (mean, unbiased variance) instead of updating its running statistics in place, which a function
    under torch.func.grad cannot do to a tensor it does not differentiate. `index` is None for a
    layer that keeps no running statistics."""

    def __init__(self, norm: nn.modules.batchnorm._BatchNorm, state: PassState, index: int | None):
        super().__init__()
        self.weight, self.bias = norm.weight, norm.bias      # the same parameter names as the layer's
        self.eps = norm.eps
        self.state = state
        self.index = index

    def forward(self, inputs: Tensor) -> Tensor:
        if self.index is not None and self.state.layout is not None:
            self.state.layout.norms.append(self.index)
        elif self.index is not None:
            dims = [0, *range(2, inputs.dim())]
            detached = inputs.detach()
            self.state.statistics.append((detached.mean(dims), detached.var(dims, correction=1)))
        return F.batch_norm(inputs, None, None, self.weight, self.bias, True, 0.0, self.eps)


class MaskedDropout(nn.Module):
    """nn.Dropout applying the pass's next mask, already scaled by 1 / (1 - p): under vmap one draw
    cannot come from each client's own stream, so the masks are drawn beforehand, one per call."""

    def __init__(self, p: float, state: PassState):
        super().__init__()
        self.p = p
        self.state = state

    def forward(self, inputs: Tensor) -> Tensor:
        if self.state.layout is not None:
            self.state.layout.dropouts.append((self.p, tuple(inputs.shape)))
            return inputs
        return inputs * self.state.masks.popleft()


class BatchedModule:
    """The model as vmap trains it: BatchNorm layers as BatchStatistics, nn.Dropout layers as
    MaskedDropout, the parameters those of the worker's resident model."""

    def __init__(self, module: nn.Module):
        self.state = PassState()
        self.module = _rebuilt(copy.deepcopy(module), self.state)
        buffer_offsets, offset = {}, 0
        for name, buffer in module.named_buffers():
            if buffer.is_floating_point():
                buffer_offsets[name] = offset
                offset += buffer.numel()
        # Where each tracking BatchNorm layer's running mean and variance sit in FlatModel.buffers, by
        # BatchStatistics.index.
        self.running = [(buffer_offsets[f"{name}.running_mean"], buffer_offsets[f"{name}.running_var"],
                         layer.num_features, layer.momentum) for name, layer in _tracking_norms(module)]
        self.draws_masks = any(isinstance(layer, MaskedDropout) for layer in self.module.modules())
        # The same layers on the meta device, whose passes record the Layout of a batch shape.
        self.probe_state = PassState()
        self.probe = _rebuilt(copy.deepcopy(module).to("meta"), self.probe_state)
        self.layouts: dict[tuple, Layout] = {}

    def __call__(self, named: dict[str, Tensor], inputs: Tensor,
                 masks: tuple[Tensor, ...]) -> tuple[Tensor, tuple[tuple[Tensor, Tensor], ...]]:
        """Logits, with `masks` applied in dropout-call order, and the (mean, variance) of each call of a
        tracking BatchNorm layer, in call order (Layout.norms)."""
        self.state.masks = deque(masks)
        logits = functional_call(self.module, named, (inputs,))
        statistics = tuple(self.state.statistics)
        self.state.statistics = []     # tensors of a transform's levels, invalid once it returns
        return logits, statistics

    def layout(self, inputs: Tensor) -> Layout:
        """The Layout of a pass over one client's `inputs`, from a pass on the meta device."""
        key = (tuple(inputs.shape), inputs.dtype)
        if key not in self.layouts:
            self.probe_state.layout = Layout()
            with torch.no_grad():
                self.probe(torch.empty(inputs.shape, dtype=inputs.dtype, device="meta"))
            self.layouts[key], self.probe_state.layout = self.probe_state.layout, None
        return self.layouts[key]

    def track(self, buffers: Tensor, statistics: tuple[tuple[Tensor, Tensor], ...], layout: Layout) -> None:
        """Moves each client's running statistics (rows of `buffers`) towards its batch's, call after call,
        as BatchNorm does."""
        for index, (mean, var) in zip(layout.norms, statistics):
            mean_at, var_at, width, momentum = self.running[index]
            buffers[:, mean_at:mean_at + width].mul_(1 - momentum).add_(mean, alpha=momentum)
            buffers[:, var_at:var_at + width].mul_(1 - momentum).add_(var, alpha=momentum)


def _tracking_norms(module: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    """The BatchNorm layers that keep running statistics, named, in named_modules' order: BatchStatistics.index
    numbers them so."""
    return [(name, layer) for name, layer in module.named_modules()
            if isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.track_running_stats]


def _rebuilt(module: nn.Module, state: PassState) -> nn.Module:
    """`module` with its BatchNorm and nn.Dropout layers replaced in place (BatchedModule); the tracking
    BatchNorm layers numbered in named_modules' order."""
    tracking = {id(layer): index for index, (_, layer) in enumerate(_tracking_norms(module))}
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.modules.batchnorm._BatchNorm):
                setattr(parent, name, BatchStatistics(child, state, tracking.get(id(child))))
            elif isinstance(child, nn.Dropout):
                setattr(parent, name, MaskedDropout(child.p, state))
    return module


class ClientBatchTask:
    """Clients' local problems for one round, stacked (implements algorithms.base.ClientTask)."""

    def __init__(self, model: FlatModel, batched: BatchedModule, client_tasks: list, buffers: Tensor,
                 dropout_seeds: list[int]):
        """`buffers`: the broadcast running statistics every client starts from; `dropout_seeds`: each
        client's dropout stream, as its sequential training seeds the default generator."""
        self.model = model
        self.batched = batched
        self.client_tasks = client_tasks
        self.num_samples = [task.num_samples for task in client_tasks]
        self.shapes = [(name, parameter.shape, parameter.numel()) for name, parameter
                       in model.module.named_parameters() if parameter.requires_grad]
        self.per_client_grad = vmap(grad_and_value(self._loss, has_aux=True))
        self.stacked_buffers = buffers.expand(len(client_tasks), -1).clone()
        # Running statistics move only in passes at the clients' own parameters, as in ClientTask._at.
        self.resident: Tensor | None = None
        self.generator = _default_generator(model.device)
        self.dropout_states = self._seeded_states(dropout_seeds) if batched.draws_masks else []

    def start_from(self, params: Tensor) -> Tensor:
        self.resident = params.expand(len(self.client_tasks), -1).clone()
        return self.resident

    def buffers(self) -> Tensor:
        """Each client's running statistics, (clients, number of buffer entries)."""
        return self.stacked_buffers.clone()

    def next_batch(self) -> tuple[Tensor, Tensor, Tensor]:
        """Every client's next minibatch, padded to the longest with weight-0 rows: clients whose
        sample counts leave a shorter last batch of an epoch still train on exactly their own rows."""
        return self._stacked([task.next_rows() for task in self.client_tasks])

    def draw_batch(self, size: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        return self._stacked([task.draw_rows(size) for task in self.client_tasks])

    def _stacked(self, rows: list[Tensor], augment: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        padded = pad_sequence(rows, batch_first=True)       # padding: row 0 of the dataset, weighted 0
        lengths = torch.tensor([r.shape[0] for r in rows], device=padded.device)
        weights = torch.arange(padded.shape[1], device=padded.device) < lengths[:, None]
        task = self.client_tasks[0]
        if task.augment_generator is None or not augment:
            inputs = task.train_x[padded]
        else:
            # Each client augments only its own rows, from its own stream, as it would training alone.
            inputs = pad_sequence([client.inputs(r) for client, r in zip(self.client_tasks, rows)], batch_first=True)
        return inputs, task.train_y[padded], weights.to(torch.float32)     # float even for token inputs

    def loss_and_grad(self, params: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        return self._pass(params, batch, self._draw_masks(batch[0][0]))

    def paired_loss_and_grad(self, current: Tensor, previous: Tensor,
                             batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Both passes with the same dropout masks, as ClientTask.paired_loss_and_grad."""
        masks = self._draw_masks(batch[0][0])
        loss, grad = self._pass(current, batch, masks)
        return loss, grad, self._pass(previous, batch, masks)[1]

    def full_loss_and_grad(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """Each client's mean loss and gradient over all its samples, FULL_GRADIENT_CHUNK columns at a time;
        running statistics are left as they were."""
        rows = [task.sample_indices for task in self.client_tasks]
        counts = torch.tensor([len(r) for r in rows], device=params.device, dtype=params.dtype)
        loss_sum = torch.zeros(len(rows), dtype=torch.float64, device=params.device)
        grad_sum = torch.zeros_like(params)
        for start in range(0, max(len(r) for r in rows), FULL_GRADIENT_CHUNK):
            chunk = [r[start:start + FULL_GRADIENT_CHUNK] for r in rows]
            present = [i for i, c in enumerate(chunk) if len(c)]
            inputs, targets, weights = self._stacked([chunk[i] for i in present], augment=False)
            masks = self._draw_masks(inputs[0], present)
            grads, (losses, _) = self._per_client_grad(params[present], inputs, targets, weights, masks)
            sizes = weights.sum(dim=1)
            loss_sum[present] += losses.detach().double() * sizes.double()
            grad_sum[present] += grads * sizes[:, None]
        return (loss_sum / counts.double()).float(), grad_sum.div_(counts[:, None])

    def _pass(self, params: Tensor, batch: tuple[Tensor, Tensor, Tensor],
              masks: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        (grads, (losses, statistics)) = self._per_client_grad(params, *batch, masks)
        if params is self.resident:
            self.batched.track(self.stacked_buffers, statistics, self.batched.layout(batch[0][0]))
        return losses.detach(), grads

    def _per_client_grad(self, params: Tensor, inputs: Tensor, targets: Tensor, weights: Tensor,
                         masks: tuple[Tensor, ...]) -> tuple[Tensor, tuple]:
        """Each client's gradient and (loss, statistics) at its row of `params`; in a pack
        (rayfed.engine.pack), computed together with the other packed runs' clients."""
        member = current_member()
        if member is None:
            return self.per_client_grad(params, inputs, targets, weights, masks)
        return member.per_client_pass(self._gradients_of_rows, params, inputs, targets, weights, *masks)

    def _gradients_of_rows(self, params: Tensor, inputs: Tensor, targets: Tensor, weights: Tensor,
                           *masks: Tensor) -> tuple[Tensor, tuple]:
        return self.per_client_grad(params, inputs, targets, weights, masks)

    def _loss(self, flat: Tensor, inputs: Tensor, targets: Tensor, weights: Tensor,
              masks: tuple[Tensor, ...]) -> tuple[Tensor, tuple]:
        named, offset = {}, 0
        for name, shape, size in self.shapes:
            named[name] = flat[offset:offset + size].view(shape)
            offset += size
        logits, statistics = self.batched(named, inputs, masks)
        losses = F.cross_entropy(logits, targets, reduction="none")
        return (losses * weights).sum() / weights.sum(), statistics

    def _seeded_states(self, seeds: list[int]) -> list[Tensor]:
        saved = self.generator.get_state()
        states = []
        for seed in seeds:
            self.generator.manual_seed(seed)
            states.append(self.generator.get_state())
        self.generator.set_state(saved)
        return states

    def _draw_masks(self, client_inputs: Tensor, clients: list[int] | None = None) -> tuple[Tensor, ...]:
        """Each dropout call's masks for one pass of `clients` (default all) over batches shaped as
        `client_inputs`, stacked over the clients: each client's from its own stream, by F.dropout on ones
        of its activations' shape, so that they are the masks the client's sequential pass would draw
        (every client's batch has that shape: vectorize_blocker refuses dropout where sizes differ)."""
        if not self.dropout_states:
            return ()
        calls = self.batched.layout(client_inputs).dropouts
        # F.dropout's mask depends on the shape and the generator alone: one tensor of ones per call serves all.
        ones = [torch.ones(shape, dtype=self.model.params.dtype, device=self.model.device) for _, shape in calls]
        saved = self.generator.get_state()
        per_call = [[] for _ in calls]
        for client in (range(len(self.client_tasks)) if clients is None else clients):
            self.generator.set_state(self.dropout_states[client])
            for masks, (rate, _), call_ones in zip(per_call, calls, ones):
                masks.append(F.dropout(call_ones, rate, training=True))
            self.dropout_states[client] = self.generator.get_state()
        self.generator.set_state(saved)
        return tuple(torch.stack(masks) for masks in per_call)


def _default_generator(device: torch.device) -> torch.Generator:
    """The generator dropout draws from on `device` (seeded per client by seeding.seed_global_torch)."""
    if device.type != "cuda":
        return torch.default_generator
    return torch.cuda.default_generators[torch.cuda.current_device() if device.index is None else device.index]
