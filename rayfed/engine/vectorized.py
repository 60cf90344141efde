"""Training a worker's clients of a round as one batched computation (engine.vectorize).

ClientBatchTask implements the ClientTask protocol with a leading client dimension: parameters
are (clients, d), a batch is every client's next minibatch stacked, and the gradient is taken
per client with torch.func.vmap. An algorithm whose local step is written with broadcasting
ops (FedAvgM's local_sgd) then trains all clients at once, unchanged. Each client keeps its own
parameters, minibatch stream, sample count, BatchNorm running statistics and dropout stream, so
results equal sequential training up to floating-point reordering inside the batched kernels. Where
clients' minibatches differ in length, BatchNorm normalises each client with the statistics of its real
rows alone and dropout draws each client's masks for its real rows, as its sequential pass does.
"""
from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.utils._pytree import tree_map

from rayfed.algorithms.base import Algorithm
from rayfed.engine.pack import current_member
from rayfed.algorithms.objective import OutputLoss, takes_row_weights
from rayfed.models import FlatModel
from rayfed.models.forward import ModelForward, Structure, structure_of

# Samples per forward pass of a full local gradient: bounds its memory whatever a client holds.
FULL_GRADIENT_CHUNK = 1024


def vectorize_blocker(algorithm_name: str, algorithm: Algorithm, module: nn.Module,
                      steps_differ_between_clients: bool = False) -> str | None:
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
    """What the rebuilt layers of one model share during a pass: the dropout masks still to apply, the
    batch statistics reported so far, both in call order, and `rows`, the client's row weights (1 for
    its own rows, 0 for padding); while `layout` is set (a probe pass over zeros), the layers record
    what they are called with there instead."""

    def __init__(self):
        self.masks: deque[Tensor] = deque()
        self.rows: Tensor | None = None
        self.statistics: list[tuple[Tensor, Tensor]] = []
        self.layout: Layout | None = None


class BatchStatistics(nn.Module):
    """A BatchNorm layer in train mode that normalises with its batch's statistics and reports them
    (mean, unbiased variance) instead of updating its running statistics in place, which a function
    under torch.func.grad cannot do to a tensor it does not differentiate. The statistics are those of
    the client's real rows (dim 0), as BatchNorm computes them on its unpadded batch; padding rows are
    normalised with them too, which keeps their outputs finite. Always by the same formula, padded or
    not: F.batch_norm's kernel for unpadded passes would make a client's bits depend on whether another
    client in its batch is padded, and so on how the clients are grouped into workers. `index` is None
    for a layer that keeps no running statistics."""

    def __init__(self, norm: nn.modules.batchnorm._BatchNorm, state: PassState, index: int | None):
        super().__init__()
        self.weight, self.bias = norm.weight, norm.bias      # the same parameter names as the layer's
        self.eps = norm.eps
        self.state = state
        self.index = index

    def forward(self, inputs: Tensor) -> Tensor:
        if self.state.layout is not None:
            if self.index is not None:
                self.state.layout.norms.append(self.index)
            return F.batch_norm(inputs, None, None, self.weight, self.bias, True, 0.0, self.eps)
        return self._over_rows(inputs, self.state.rows)

    def _over_rows(self, inputs: Tensor, rows: Tensor) -> Tensor:
        """Batch normalisation with the mean and biased variance of the rows weighted 1 in `rows`."""
        dims = [0, *range(2, inputs.dim())]
        per_channel = [1, -1, *[1] * (inputs.dim() - 2)]
        weights = rows.to(inputs.dtype).view(-1, *[1] * (inputs.dim() - 1))
        count = rows.sum().to(inputs.dtype) * (inputs[0, 0].numel())
        mean = (inputs * weights).sum(dims, keepdim=True) / count
        centred = inputs - mean
        squares = (centred.square() * weights).sum(dims, keepdim=True)
        if self.index is not None:
            self.state.statistics.append((mean.detach().flatten(), squares.detach().flatten() / (count - 1)))
        outputs = centred * torch.rsqrt(squares / count + self.eps)
        if self.weight is not None:
            outputs = outputs * self.weight.view(per_channel) + self.bias.view(per_channel)
        return outputs


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
        # The same layers, whose passes over zeros record the Layout of a batch shape: on the model's device,
        # as a first pass on the meta device spends seconds loading torch's meta kernels.
        self.probe_state = PassState()
        self.probe = _rebuilt(copy.deepcopy(module), self.probe_state)
        self.layouts: dict[tuple, Layout] = {}

    def __call__(self, named: dict[str, Tensor], inputs: Tensor, masks: tuple[Tensor, ...],
                 rows: Tensor) -> tuple[Tensor, tuple[tuple[Tensor, Tensor], ...]]:
        """Logits, with `masks` applied in dropout-call order, and the (mean, variance) of each call of a
        tracking BatchNorm layer, in call order (Layout.norms); `rows`: the client's row weights
        (PassState.rows)."""
        self.state.masks = deque(masks)
        self.state.rows = rows
        logits = functional_call(self.module, named, (inputs,))
        statistics = tuple(self.state.statistics)
        # tensors of a transform's levels, invalid once it returns
        self.state.statistics, self.state.rows = [], None
        return logits, statistics

    def layout(self, inputs: Tensor) -> Layout:
        """The Layout of a pass over one client's `inputs`, from a probe pass over zeros of their shape."""
        key = (tuple(inputs.shape), inputs.dtype)
        if key not in self.layouts:
            self.probe_state.layout = Layout()
            with torch.no_grad():
                self.probe(torch.zeros(inputs.shape, dtype=inputs.dtype, device=inputs.device))
            self.layouts[key], self.probe_state.layout = self.probe_state.layout, None
        return self.layouts[key]

    def track(self, buffers: Tensor, statistics: tuple[tuple[Tensor, Tensor], ...], layout: Layout) -> None:
        """Moves each client's running statistics (rows of `buffers`) towards its batch's, call after call,
        as BatchNorm does."""
        for index, (mean, var) in zip(layout.norms, statistics):
            mean_at, var_at, width, momentum = self.running[index]
            buffers[:, mean_at:mean_at + width].mul_(1 - momentum).add_(mean, alpha=momentum)
            buffers[:, var_at:var_at + width].mul_(1 - momentum).add_(var, alpha=momentum)

    @cached_property
    def frozen(self) -> nn.Module:
        """`module`'s layers for frozen passes in train mode (ClientTask.forward_at): their dropout calls take
        the pass's masks in call order with the trained model's, and their BatchNorm calls report nothing
        (a frozen pass moves no running statistics)."""
        module = copy.deepcopy(self.module, {id(self.state): self.state})
        for layer in module.modules():
            if isinstance(layer, BatchStatistics):
                layer.index = None
        return module


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
        self.sizes = [size for _, _, size in self.shapes]
        self.per_client_losses = vmap(self._loss)
        # vmap has no batching rule for a recurrent layer's fused kernel outside torch.func.grad, which decomposes it.
        self.recurrent = any(isinstance(layer, nn.RNNBase) for layer in model.module.modules())
        self.per_client_grad_and_value = vmap(grad_and_value(self._flat_loss, has_aux=True))
        self.stacked_buffers = buffers.expand(len(client_tasks), -1).clone()
        # Running statistics move only in passes at the clients' own parameters, as in ClientTask._at.
        self.resident: Tensor | None = None
        self.generator = _default_generator(model.device)
        self.dropout_states = self._seeded_states(dropout_seeds) if batched.draws_masks else []
        # The Layout of each objective's passes by (loss, shapes of one client's batch), found once a round.
        self.objective_layouts: dict[tuple, Layout] = {}
        self.frozen_rows = FrozenRows()

    def start_from(self, params: Tensor) -> Tensor:
        self.resident = params.expand(len(self.client_tasks), -1).clone()
        return self.resident

    def buffers(self) -> Tensor:
        """Each client's running statistics, (clients, number of buffer entries)."""
        return self.stacked_buffers.clone()

    @property
    def batch_rows(self) -> int:
        """Rows of every stacked minibatch: the configured batch size whatever the clients hold, so that a
        client's padded batch, and with it its bits, do not depend on which clients share its batch."""
        return self.client_tasks[0].requested_batch_size

    def next_batch(self) -> tuple[Tensor, Tensor, Tensor]:
        """Every client's next minibatch, padded to batch_rows with weight-0 rows: clients whose
        sample counts leave a shorter last batch of an epoch still train on exactly their own rows."""
        return self._stacked([task.next_rows() for task in self.client_tasks], self.batch_rows)

    def draw_batch(self, size: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        return self._stacked([task.draw_rows(size) for task in self.client_tasks], size or self.batch_rows)

    def _stacked(self, rows: list[Tensor], length: int, augment: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """The clients' `rows` padded to `length` rows (or the longest, if longer) with weight-0 rows."""
        length = max(length, *(r.shape[0] for r in rows))
        padded = _padded_rows(rows, length)
        lengths = torch.tensor([r.shape[0] for r in rows], device=padded.device)
        weights = torch.arange(padded.shape[1], device=padded.device) < lengths[:, None]
        task = self.client_tasks[0]
        if task.augment_generator is None or not augment:
            inputs = task.train_x[padded]
        else:
            # Each client augments only its own rows, from its own stream, as it would training alone.
            inputs = _padded_rows([client.inputs(r) for client, r in zip(self.client_tasks, rows)], length)
        if all(client.train_y is task.train_y for client in self.client_tasks):
            labels = task.train_y[padded]
        else:
            # Some clients train on labels of their own (an attack's poisoned ones).
            labels = torch.stack([client.train_y[row] for client, row in zip(self.client_tasks, padded)])
        return inputs, labels, weights.to(torch.float32)     # float even for token inputs

    def loss_and_grad(self, params: Tensor, batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        lengths = _lengths(batch[2])
        return self._pass(params, batch, lengths, self._draw_masks(batch[0][0], lengths))

    def paired_loss_and_grad(self, current: Tensor, previous: Tensor,
                             batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Both passes with the same dropout masks, as ClientTask.paired_loss_and_grad."""
        lengths = _lengths(batch[2])
        masks = self._draw_masks(batch[0][0], lengths)
        loss, grad = self._pass(current, batch, lengths, masks)
        return loss, grad, self._pass(previous, batch, lengths, masks)[1]

    def full_loss_and_grad(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """Each client's mean loss and gradient over all its samples, FULL_GRADIENT_CHUNK samples at a time as
        sequential training takes them (BatchNorm's statistics are a chunk's); running statistics are left as
        they were. Chunks are padded to the longest client's, so with clients of different sizes a client's
        bits depend on its batch-mates here (within float32 reordering)."""
        rows = [task.sample_indices for task in self.client_tasks]
        counts = torch.tensor([len(r) for r in rows], device=params.device, dtype=params.dtype)
        loss_sum = torch.zeros(len(rows), dtype=torch.float64, device=params.device)
        grad_sum = torch.zeros_like(params)
        for start in range(0, max(len(r) for r in rows), FULL_GRADIENT_CHUNK):
            chunk = [r[start:start + FULL_GRADIENT_CHUNK] for r in rows]
            present = [i for i, c in enumerate(chunk) if len(c)]
            inputs, targets, weights = self._stacked([chunk[i] for i in present], 0, augment=False)
            lengths = _lengths(weights)
            masks = self._draw_masks(inputs[0], lengths, present)
            grads, (losses, _) = self._per_client_grad(params[present], inputs, targets, weights, masks)
            sizes = weights.sum(dim=1)
            loss_sum[present] += losses.detach().double() * sizes.double()
            grad_sum[present] += grads * sizes[:, None]
        return (loss_sum / counts.double()).float(), grad_sum.div_(counts[:, None])

    def _pass(self, params: Tensor, batch: tuple[Tensor, Tensor, Tensor], lengths: list[int],
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
        if member is not None:
            return member.per_client_pass(self._gradients_of_rows, params, inputs, targets, weights, *masks)
        if params.shape[0] > 1:
            return self.per_client_grad(params, inputs, targets, weights, masks)
        # vmap over one client takes other kernels than over several (other bits): a worker left with one
        # client computes it twice, so that its bits do not depend on how the clients were grouped.
        twice = [torch.cat([tensor, tensor]) for tensor in (params, inputs, targets, weights, *masks)]
        return tree_map(lambda leaf: leaf[:1] if isinstance(leaf, Tensor) and leaf.dim() else leaf,
                        self.per_client_grad(*twice[:4], tuple(twice[4:])))

    def _gradients_of_rows(self, params: Tensor, inputs: Tensor, targets: Tensor, weights: Tensor,
                           *masks: Tensor) -> tuple[Tensor, tuple]:
        return self.per_client_grad(params, inputs, targets, weights, masks)

    def per_client_grad(self, params: Tensor, inputs: Tensor, targets: Tensor, weights: Tensor,
                        masks: tuple[Tensor, ...]) -> tuple[Tensor, tuple]:
        """Each client's gradient and (loss, statistics) at its row of `params`, as
        vmap(grad_and_value(_loss)) gives them: a client's loss depends on its own row alone, so one
        backward pass of the summed losses gives every client's gradient. The leaves are the parameter
        tensors' columns of `params`, shaped as the parameters, not `params`: a slice of one flat leaf would
        backpropagate a zero-filled full-width gradient per parameter tensor."""
        if self.recurrent:
            grads, (losses, statistics) = self.per_client_grad_and_value(params, inputs, targets, weights, masks)
            return grads, (losses.detach(), statistics)
        leaves = [part.detach().view(-1, *shape).requires_grad_()
                  for part, (_, shape, _) in zip(params.split(self.sizes, dim=1), self.shapes)]
        with torch.enable_grad():
            losses, statistics = self.per_client_losses(leaves, inputs, targets, weights, masks)
            grads = torch.autograd.grad(losses.sum(), leaves, allow_unused=True, materialize_grads=True)
        out = torch.empty_like(params)
        # Copied straight into their columns: a layer's gradient may come out transposed, which a reshape
        # before torch.cat would copy once more.
        for part, (_, shape, _), grad in zip(out.split(self.sizes, dim=1), self.shapes, grads):
            part.view(-1, *shape).copy_(grad)
        return out, (losses.detach(), statistics)

    def _flat_loss(self, flat: Tensor, inputs: Tensor, targets: Tensor, weights: Tensor,
                   masks: tuple[Tensor, ...]) -> tuple[Tensor, tuple]:
        parts = [part.view(shape) for part, (_, shape, _) in zip(flat.split(self.sizes), self.shapes)]
        return self._loss(parts, inputs, targets, weights, masks)

    def _loss(self, parts: list[Tensor], inputs: Tensor, targets: Tensor, weights: Tensor,
              masks: tuple[Tensor, ...]) -> tuple[Tensor, tuple]:
        named = {name: part for (name, _, _), part in zip(self.shapes, parts)}
        logits, statistics = self.batched(named, inputs, masks, weights)
        losses = F.cross_entropy(logits, targets, reduction="none")
        return (losses * weights).sum() / weights.sum(), statistics

    def objective_loss_and_grad(self, params: Tensor, batch: tuple[Tensor, Tensor, Tensor],
                                loss_fn: OutputLoss) -> tuple[Tensor, Tensor]:
        """Each client's `loss_fn` and its gradient at its row of `params` (ClientTask.objective_loss_and_grad),
        its frozen passes (forward_at) at its own rows. A loss that takes per-row `weights` gets its client's and
        runs for all clients at once; one that does not reduces over every row it is given, so it runs once per
        group of clients whose batches hold the same number of rows, without their padding."""
        inputs, targets, weights = batch
        clients = torch.arange(len(self.client_tasks), device=params.device)
        if takes_row_weights(loss_fn):
            return self._objective_pass(params, batch, clients, loss_fn, True)
        lengths = weights.sum(dim=1).long()
        if bool((lengths == inputs.shape[1]).all()):
            return self._objective_pass(params, batch, clients, loss_fn, False)
        losses, grads = torch.empty(len(clients), dtype=params.dtype, device=params.device), torch.empty_like(params)
        for length in lengths.unique().tolist():
            group = clients[lengths == length]
            losses[group], grads[group] = self._objective_pass(
                params, (inputs[group, :length], targets[group, :length], weights[group, :length]), group, loss_fn,
                False)
        return losses, grads

    def forward_at(self, params: Tensor, buffers: Tensor, train: bool = False) -> ModelForward:
        """The clients' frozen passes, each at its row of `params` with its row of running statistics `buffers`
        (one row serves all): in eval mode through the model's own layers, in train mode through BatchedModule.frozen.
        They run inside objective_loss_and_grad, whose batched computation picks each client's rows."""
        clients = len(self.client_tasks)
        params, buffers = params.detach().expand(clients, -1), buffers.detach().expand(clients, -1)
        tensors, offset = {}, 0
        for name, shape, size in self.shapes:
            tensors[name] = params[:, offset:offset + size].view(clients, *shape)
            offset += size
        if not train:
            offset = 0
            for name, buffer in self.model.module.named_buffers():
                if buffer.is_floating_point():
                    tensors[name] = buffers[:, offset:offset + buffer.numel()].view(clients, *buffer.shape)
                    offset += buffer.numel()
        module = self.batched.frozen if train else self.model.module
        return StackedForward(module, structure_of(self.model.module), tensors, train, self.frozen_rows)

    def _objective_pass(self, params: Tensor, batch: tuple[Tensor, Tensor, Tensor], clients: Tensor,
                        loss_fn: OutputLoss, weighted: bool) -> tuple[Tensor, Tensor]:
        """objective_loss_and_grad for `clients` (indices into the stack), whose batches `batch` are."""
        rows = params if len(clients) == len(self.client_tasks) else params[clients]
        layout = self._objective_layout(loss_fn, rows, batch, weighted)
        masks = self._masks(layout.dropouts, batch[0].shape[1], _lengths(batch[2]), clients.tolist())
        per_client = vmap(grad_and_value(partial(self._objective_loss, loss_fn, weighted), has_aux=True))
        grads, (losses, statistics) = per_client(rows, *batch, masks, clients)
        if params is self.resident and layout.norms:
            buffers = self.stacked_buffers if rows is params else self.stacked_buffers[clients]
            self.batched.track(buffers, statistics, layout)
            if rows is not params:
                self.stacked_buffers[clients] = buffers
        return losses.detach(), grads

    def _objective_loss(self, loss_fn: OutputLoss, weighted: bool, flat: Tensor, inputs: Tensor, targets: Tensor,
                        weights: Tensor, masks: tuple[Tensor, ...], client: Tensor) -> tuple[Tensor, tuple]:
        """One client's objective at `flat` (under vmap): its frozen passes take its rows, its dropout calls
        `masks` in call order; with the statistics of the trained model's BatchNorm calls."""
        self.batched.state.masks = deque(masks)
        self.batched.state.rows = weights
        # stacked[client] would read the index's value, which a batched computation has none of.
        self.frozen_rows.select = lambda stacked: stacked.index_select(0, client.unsqueeze(0))[0]
        try:
            loss = _call(loss_fn, weighted, self._trained(flat), inputs, targets, weights)
        finally:
            self.frozen_rows.select = None
        statistics = tuple(self.batched.state.statistics)
        # tensors of a transform's levels, invalid once it returns
        self.batched.state.statistics, self.batched.state.rows = [], None
        return loss, statistics

    def _trained(self, flat: Tensor) -> ModelForward:
        """The trained model's passes at `flat`, through BatchedModule's layers."""
        named, offset = {}, 0
        for name, shape, size in self.shapes:
            named[name] = flat[offset:offset + size].view(shape)
            offset += size
        return ModelForward(self.batched.module, structure_of(self.model.module), named)

    def _objective_layout(self, loss_fn: OutputLoss, params: Tensor, batch: tuple[Tensor, Tensor, Tensor],
                          weighted: bool) -> Layout:
        """The Layout of `loss_fn`'s passes over one client's batch shaped as `batch`'s: the dropout calls of its
        trained and frozen passes, and the trained model's BatchNorm calls, in call order (the loss may run the
        model more than once, and frozen passes between), from a pass of the first client of `params` (clients, d)
        and `batch` (on the meta device such a loss's reductions take longer than the pass)."""
        if not (self.batched.draws_masks or self.batched.running):
            return Layout()
        key = (loss_fn, *((tuple(part.shape[1:]), part.dtype) for part in batch))
        if key not in self.objective_layouts:
            self.batched.state.layout = Layout()
            self.frozen_rows.select = lambda stacked: stacked[0]
            try:
                with torch.no_grad():
                    _call(loss_fn, weighted, self._trained(params[0]), *(part[0] for part in batch))
                self.objective_layouts[key] = self.batched.state.layout
            finally:
                self.batched.state.layout = None
                self.frozen_rows.select = None
        return self.objective_layouts[key]

    def _seeded_states(self, seeds: list[int]) -> list[Tensor]:
        saved = self.generator.get_state()
        states = []
        for seed in seeds:
            self.generator.manual_seed(seed)
            states.append(self.generator.get_state())
        self.generator.set_state(saved)
        return states

    def _draw_masks(self, client_inputs: Tensor, lengths: list[int],
                    clients: list[int] | None = None) -> tuple[Tensor, ...]:
        """Each dropout call's masks for one pass of `clients` (default all; `lengths`: their real rows)
        over batches shaped as `client_inputs`, stacked over the clients: each client's from its own
        stream, by F.dropout on ones of its activations' shape on its real rows, so that they are the
        masks the client's sequential pass would draw; padding rows get zeros."""
        if not self.dropout_states:
            return ()
        return self._masks(self.batched.layout(client_inputs).dropouts, client_inputs.shape[0], lengths, clients)

    def _masks(self, calls: list[tuple[float, tuple[int, ...]]], rows: int, lengths: list[int],
               clients: list[int] | None) -> tuple[Tensor, ...]:
        """The masks of dropout calls `calls` (in call order) over batches of `rows` rows, as _draw_masks says;
        an objective's passes (objective_loss_and_grad) give their own calls."""
        if not calls:
            return ()
        if min(lengths) < rows and any(shape[0] != rows for _, shape in calls):
            raise ValueError(f"engine.vectorize: a dropout layer's inputs have {rows} rows per batch of "
                             f"{[shape[0] for _, shape in calls]}; clients' batches of different lengths need "
                             f"dropout over the batch's rows")
        # F.dropout's mask depends on the shape and the generator alone: one tensor of ones per shape serves all.
        ones: dict[tuple[int, ...], Tensor] = {}
        saved = self.generator.get_state()
        per_call = [[] for _ in calls]
        for client, length in zip(range(len(self.client_tasks)) if clients is None else clients, lengths):
            self.generator.set_state(self.dropout_states[client])
            for masks, (rate, shape) in zip(per_call, calls):
                own = (length, *shape[1:]) if length < rows else shape
                if own not in ones:
                    ones[own] = torch.ones(own, dtype=self.model.params.dtype, device=self.model.device)
                mask = F.dropout(ones[own], rate, training=True)
                masks.append(mask if own == shape else torch.cat([mask, mask.new_zeros((rows - length, *shape[1:]))]))
            self.dropout_states[client] = self.generator.get_state()
        self.generator.set_state(saved)
        return tuple(torch.stack(masks) for masks in per_call)


def _padded_rows(rows: list[Tensor], length: int) -> Tensor:
    """`rows` (each (n_i, ...), n_i >= 1) stacked, each padded to `length` with copies of its own first row. The
    padding rows weigh 0, but their activations are computed: normalised with the client's BatchNorm statistics,
    another sample's could grow without bound (a client of 2 samples, layer after layer) until a loss's gradient
    is infinite there and 0 * inf a NaN; a copy of the client's own sample stays where its samples are."""
    return torch.stack([torch.cat([own, own[:1].expand(length - len(own), *own.shape[1:])]) for own in rows])


def _lengths(weights: Tensor) -> list[int]:
    """Each client's real rows in a stacked batch, from its row weights (ClientBatchTask._stacked)."""
    return weights.sum(dim=1).long().tolist()


class FrozenRows:
    """Which rows of a stacked tensor a frozen pass takes: set by ClientBatchTask while an objective's pass runs
    (the rows of the client its batched computation is at; the first client's while its Layout is found)."""

    def __init__(self):
        self.select: Callable[[Tensor], Tensor] | None = None

    def __call__(self, stacked: Tensor) -> Tensor:
        if self.select is None:
            raise RuntimeError("a stack of clients runs its frozen passes (forward_at) only inside its objective's "
                               "loss (objective_loss_and_grad)")
        return self.select(stacked)


class StackedForward(ModelForward):
    """Frozen passes of a stack of clients (ClientBatchTask.forward_at): `tensors` hold a row per client, and
    each pass takes the rows that `rows` selects."""

    def __init__(self, module: nn.Module, structure: Structure, tensors: dict[str, Tensor], train: bool,
                 rows: FrozenRows):
        super().__init__(module, structure, tensors, train)
        self.rows = rows

    def _tensors(self, start: int, stop: int) -> dict[str, Tensor]:
        return {name: self.rows(stacked) for name, stacked in super()._tensors(start, stop).items()}


def _call(loss_fn: OutputLoss, weighted: bool, model: ModelForward, inputs: Tensor, targets: Tensor,
          weights: Tensor) -> Tensor:
    """One client's objective on its batch, given its per-row weights where the loss takes them."""
    return loss_fn(model, inputs, targets, weights=weights) if weighted else loss_fn(model, inputs, targets)


def _default_generator(device: torch.device) -> torch.Generator:
    """The generator dropout draws from on `device` (seeded per client by seeding.seed_global_torch)."""
    if device.type != "cuda":
        return torch.default_generator
    return torch.cuda.default_generators[torch.cuda.current_device() if device.index is None else device.index]
