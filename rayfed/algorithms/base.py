"""The Algorithm interface: pure maths on flat float32 parameter vectors.

An algorithm says what the server broadcasts, how one client trains from that broadcast
and its own persistent state, and how the server folds the uploads into its state. It
never sees Ray, actors, devices or files; the engines move its tensors around.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from torch import Tensor

from rayfed.algorithms.objective import LocalObjective, OutputLoss
from rayfed.algorithms.params import AlgorithmParams
from rayfed.algorithms.summed_uploads import CombinedUploads
from rayfed.errors import ConfigError
from rayfed.models.flat import FlatModel
from rayfed.models.forward import ModelForward
from rayfed.registry import ALGORITHMS

Batch = tuple[Tensor, Tensor]
FLOAT32_BYTES = 4


class ClientTask(Protocol):
    """One client's local problem, as handed to `Algorithm.client_train` by a worker. Under
    engine.vectorize it is a stack of clients (a ClientBatchTask): the same methods on (clients, d)
    parameters, and `num_samples` a list."""

    num_samples: int
    """The client's training samples n_i: what its Upload reports, and what agg_weighting=num_samples weighs by."""
    steps: int
    """Its local steps this round (train.local_steps, local_epochs or the adaptive interval): what
    local_descent runs."""
    lr_factor: float
    """The round's learning-rate decay gamma^t (train.lr_decay): a local rate lr is lr * lr_factor this round."""

    def start_from(self, params: Tensor) -> Tensor:
        """Loads `params` into the resident model and returns its flat parameter vector.
        Updating that vector in place updates the model; gradients at it need no copy."""

    def next_batch(self) -> Batch:
        """The next minibatch from this client's own random stream for this round."""

    def loss_and_grad(self, params: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        """Mean loss (a detached scalar tensor) and its gradient at `params` on `batch`, in train mode.
        At the resident vector this is a training step's gradient (BatchNorm statistics update);
        anywhere else the resident model, its statistics included, is left as it was.
        The gradient is a reused buffer, valid until the next call."""

    def draw_batch(self, size: int | None = None) -> Batch:
        """`size` samples (default the batch size) drawn without replacement, independently of the
        other draws: the minibatches of FedMoS's and STEM's STORM steps, whose estimator needs each fresh batch
        unbiased given the past (next_batch's epochs are not)."""

    def objective_loss_and_grad(self, params: Tensor, batch: Batch, loss_fn: OutputLoss) -> tuple[Tensor, Tensor]:
        """loss_and_grad of `loss_fn(model, inputs, targets)`, a loss of the model's outputs that
        replaces cross-entropy (algorithms.objective): `model` is the model at `params`, and the loss
        may also run frozen passes (forward_at). A stack of clients runs it for each client at its own
        parameters, frozen passes at its own rows: a loss that takes `weights` gets its client's per-row
        weights (padding rows weigh 0), one that does not runs on groups of clients with unpadded batches."""

    def buffers(self) -> Tensor:
        """A copy of the resident model's running statistics (BatchNorm); at the start of
        client_train they are the broadcast's."""

    def forward_at(self, params: Tensor, buffers: Tensor, train: bool = False) -> ModelForward:
        """The model's passes at another parameter vector with running statistics `buffers`, frozen:
        no gradient reaches `params` (rayfed.models.forward). For a stack of clients, `params` and
        `buffers` are one row per client or one for all, and the passes run inside objective_loss_and_grad."""

    def paired_loss_and_grad(self, current: Tensor, previous: Tensor, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """loss_and_grad at `current`, and the gradient at `previous` on the same batch with the same
        dropout masks (a STORM step's two evaluations, FedMoS Eq. 3). Both gradients are fresh
        tensors or buffers valid until the next call."""

    def full_loss_and_grad(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """The mean loss and its gradient over all the client's samples at `params`, in train mode."""

    def decay(self, params: Tensor, lr: float) -> None:
        """Decoupled weight decay of a step with learning rate `lr`, in place, after the step's
        direction is taken and before it is applied (a no-op unless train.weight_decay_mode=decoupled)."""


@dataclass
class Upload:
    """What one client sends back: named tensors, its sample count and training metrics."""

    tensors: dict[str, Tensor]
    """The uploaded vectors by name (a model change, control variates, ...): the traffic counted, and
    what server_step reads (through weighted_average, or one by one)."""
    num_samples: int
    """The client's training samples n_i (task.num_samples)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The client's training metrics: `train_loss`, its mean minibatch loss, which every client reports
    (metrics.jsonl's train_loss is their mean over the round's counted clients)."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@dataclass(frozen=True)
class RoundInfo:
    """What `Algorithm.server_step` knows of the round besides the uploads."""

    round: int
    """The 0-based index of the round being completed."""
    sampled: tuple[int, ...]
    """The round's clients, in sampling order."""
    num_clients: int
    """N, the run's clients (data.num_clients)."""
    weights: dict[int, float] | None = None
    """The selector's aggregation weights of the clients that count (selection.selector other than
    uniform); None: the algorithm weights them itself (algorithm.agg_weighting)."""
    importances: dict[int, float] | None = None
    """With such a selector, the importance p_i = D_i / sum_j D_j (over all N clients) of each client
    that counts: what MIFA weights its clients' latest updates by."""
    downlink: Callable[[Tensor], Tensor] | None = None
    """compression.downlink: the round's broadcast compressor (one draw, on the server), vector -> what
    the clients decode; None: the reply goes uncompressed."""


@dataclass(frozen=True)
class AlgorithmContext:
    """What an algorithm is built with besides its parameters. The memory estimate builds
    algorithms without a model: no x_0 there."""

    param_blocks: tuple[tuple[int, int], ...] = ()
    """The model's parameter tensors as (start, end) blocks of the flat vector."""
    local_steps: int = 1
    """The local work of a round, I (train.local_steps or local_epochs), which some server steps scale
    by (FedMoS's eta_t I)."""
    lr_decay: float = 1.0
    """The client learning rate's decay gamma (train.lr_decay), for server steps that scale by the
    round's rate (FedMoS's eta_t, FedGATE's)."""
    initial_params: Tensor | None = None
    """The run's initial model x_0, the same in every process (MOON's previous model of a client that
    has not trained yet); only for an algorithm that declares keeps_initial_model."""
    initial_buffers: Tensor | None = None
    """x_0's running statistics (BatchNorm), with initial_params."""

    @classmethod
    def of_run(cls, model: FlatModel, train, algorithm: AlgorithmParams) -> "AlgorithmContext":
        """The context of the `algorithm:` section's algorithm in a run whose process has just built
        `model`, initialised as x_0 (kept only for an algorithm that reads it)."""
        steps = train.local_epochs or train.local_steps
        if not ALGORITHMS.get(algorithm.name).target.keeps_initial_model:
            return cls(tuple(map(tuple, model.blocks)), steps, train.lr_decay)
        return cls(tuple(map(tuple, model.blocks)), steps, train.lr_decay, model.params.clone(), model.buffers.clone())


# What declaring each of Algorithm's capabilities (its class attributes below) allows, as data: the
# documentation's table of capabilities is generated from it, with the defaults read from the class.
CAPABILITIES: dict[str, str] = {
    "server_lr": "`algorithm.lr_global` applies: the section takes it and `rayfed algorithms NAME` lists it. Left "
                 "False, the key is not listed and any value but 1.0 is refused: how an algorithm without a server "
                 "learning rate drops it.",
    "weighted": "`algorithm.agg_weighting` applies (uniform or num_samples weights in `weighted_average`). Left "
                "False, the key is not listed and any value but uniform is refused: how an algorithm that weights "
                "its clients itself drops it.",
    "runs_async": "`train.round_policy=async_buffered`, where uploads come from older models.",
    "staleness_weighted": "`train.staleness_weight` may scale its uploads under async_buffered: only meaningful "
                          "where an upload is a model change.",
    "averages_models": "Says its server averages the clients' models, not model changes: such an average needs "
                       "weights that sum to 1 in every round, so `train.round_policy=async_buffered` and "
                       "`selection.selector=ucs` with `ucs_variant=paper` are refused. Each upload is named as the "
                       "broadcast tensor it replaces: `privacy.*` clips and noises its change from that tensor.",
    "takes_compression": "`compression.*` may encode its `compressed_upload` (an algorithm may name the upload "
                         "its reply reads without taking compression, as FedGATE does); `compression.downlink` "
                         "also needs `replies`.",
    "keeps_client_state": "Its clients carry state from round to round (`client_init`, the state `client_train` "
                          "returns): each trains on the worker that holds it. Set False for stateless clients: "
                          "they train on any worker and return None as their state.",
    "vectorizable": "`engine.vectorize`: given a ClientBatchTask, `client_train` trains a stack of clients at "
                    "once (local_sgd plus broadcasting tensor ops): its uploads and metrics come back stacked over "
                    "the clients, and with `keeps_client_state` it takes their states as ClientStates and returns "
                    "one state per client (`client_rows` and `per_client` write one code path for both).",
    "compressed_upload": "The name of the upload that a compressor (`compression.*`) may encode on its way to "
                         "the server: one model update, decoded before `server_step`. None: its uploads are not "
                         "compressed.",
    "replies": "The server replies to the round's clients after its step (`server_reply`) and they update their "
               "state with it (`client_finish`), as FedGATE's tracking needs the round's average; needs "
               "`keeps_client_state`.",
    "model_needs": "What its local objective takes from the model beyond the logits (rayfed.models.forward): "
                   "\"features\" (the representation, MOON's) or \"blocks\" (two or more, FedMLB's); `model.name` "
                   "is checked against it before a run.",
    "keeps_initial_model": "It reads the run's x_0 from its AlgorithmContext (`initial_params`, "
                           "`initial_buffers`): only then does every process keep a copy.",
    "sends_model": "A deployment sends the broadcast to the round's clients. False: they keep the model "
                   "themselves (FedGATE's Option I), and `bits_down` leaves the broadcast out; rayfed's engines "
                   "move it either way.",
    "transient_client_fields": "Fields of its client state that matter only from a client's training to the "
                               "server's reply (`client_finish`), such as FedGATE's uncompressed update: a spilled "
                               "state store keeps them in memory for that while instead of giving every client "
                               "room for them on disk.",
    "linear_uploads": "`engine.partial_sums`, `aggregation.rule` and central `privacy.*`: declare it when "
                      "`server_step` reads the uploads only through `weighted_average` (with the config's "
                      "agg_weighting and no selector weights). The step is then linear in the uploads, and the "
                      "workers may hand it their exact sums (SummedUploads), the rule its output, the server its "
                      "noised sum, instead of each client's.",
}


class Algorithm:
    """Base class. Subclasses hold only hyper-parameters; all state is passed in and returned.

    A registered algorithm declares itself here: `Params` (its config keys), `state_classes` (the
    classes of its server and client states: what a checkpoint may hold) and its capabilities: class
    attributes whose defaults allow nothing the algorithm does not declare (`CAPABILITIES` in
    rayfed.algorithms.base says what each allows), from which config validation, the memory check
    and the traffic figures are derived."""

    # The algorithm's config keys: the section's common keys and its own.
    Params: type[AlgorithmParams] = AlgorithmParams
    # Every class its server and client states are made of (tensors and plain containers aside).
    state_classes: tuple[type, ...] = ()
    # The capabilities, described in CAPABILITIES: a subclass declares those it has.
    server_lr = False
    weighted = False
    runs_async = False
    staleness_weighted = False
    averages_models = False
    takes_compression = False
    keeps_client_state = True
    vectorizable = False
    compressed_upload: str | None = None
    replies = False
    model_needs: str | None = None
    keeps_initial_model = False
    sends_model = True
    transient_client_fields: tuple[str, ...] = ()
    linear_uploads = False

    @classmethod
    def from_params(cls, params: AlgorithmParams, context: AlgorithmContext) -> "Algorithm":
        """The algorithm for the config's `algorithm:` section (an instance of `Params`)."""
        return cls(params, context)

    def server_init(self, params: Tensor, num_clients: int) -> Any:
        raise NotImplementedError

    def broadcast(self, server_state: Any) -> dict[str, Tensor]:
        raise NotImplementedError

    def global_params(self, server_state: Any) -> Tensor:
        raise NotImplementedError

    def upload_size(self, num_params: int) -> int:
        """Floats one client uploads, for the virtual clock's first round, before any upload arrived."""
        return num_params

    def download_size(self, num_params: int) -> int:
        """Floats the server broadcasts to each sampled client."""
        return num_params

    def memory_bytes(self, num_params: int, num_clients: int, num_blocks: int) -> dict[str, int]:
        """The memory its state needs at most, by part: "client states" (all N clients' together)
        and "server memory" (beyond the model vectors every algorithm has); checked before a run."""
        return {}

    def client_state_floats(self, num_params: int, num_buffers: int) -> int:
        """The 4-byte floats one client's state holds at most, transient fields aside, for a model of
        `num_params` parameters and `num_buffers` running statistics: what the state store budgets,
        and the width of a spilled state's row (checked against the states the algorithm returns).
        By default, memory_bytes's "client states" of one client."""
        return self.memory_bytes(num_params, 1, 1).get("client states", 0) // FLOAT32_BYTES

    def client_init(self, client_id: int) -> Any:
        """Persistent per-client state before a client's first round; None when there is none."""
        return None

    def client_train(self, task: ClientTask, down: dict[str, Tensor], client_state: Any) -> tuple[Upload, Any]:
        raise NotImplementedError

    def server_step(self, server_state: Any, uploads: dict[int, Upload],
                    round_info: RoundInfo) -> tuple[Any, dict[str, float]]:
        """The next server state and the round's algorithm metrics (diagnostics for metrics.jsonl).
        `uploads` is ordered by client id; combining in that order keeps runs bitwise reproducible."""
        raise NotImplementedError

    def server_reply(self, server_state: Any) -> dict[str, Tensor]:
        """What the server sends the round's clients after its step (only when `replies`)."""
        raise NotImplementedError

    def client_finish(self, client_state: Any, reply: dict[str, Tensor], sent: Tensor) -> Any:
        """A client's state once the reply came; `sent`: its compressed upload as the server decoded it."""
        raise NotImplementedError

    def summarize_client_states(self, client_states: list[Any]) -> dict[str, Any] | None:
        """A worker's part of the clients' state diagnostics (None: the algorithm has none)."""
        return None

    def combine_state_summaries(self, summaries: list[dict[str, Any]]) -> dict[str, float]:
        """The diagnostics of all clients' states, from the workers' parts, for metrics.jsonl."""
        return {}

    def state_bytes(self, state: Any) -> int:
        """Bytes of tensors held in a (server or client) state: the memory the docs promise to report."""
        if state is None:
            return 0
        return sum(value.numel() * value.element_size() for value in vars(state).values() if isinstance(value, Tensor))


def register_algorithm(name: str):
    """Registers an Algorithm subclass under `name` (rayfed.register_algorithm): the config's
    algorithm.name then builds it with `from_params(params, context)`."""
    def decorate(target):
        if not (isinstance(target, type) and issubclass(target, Algorithm)):
            raise ConfigError(f"register_algorithm({name!r}) takes a subclass of rayfed.Algorithm, "
                              f"not {target!r}")
        if not (isinstance(target.Params, type) and issubclass(target.Params, AlgorithmParams)):
            raise ConfigError(f"algorithm {name!r}: {target.__name__}.Params must subclass rayfed.AlgorithmParams")
        # The class's declarations; one that sets keeps_client_state per instance (GradMA) answers for itself.
        if target.replies and not target.keeps_client_state:
            raise ConfigError(f"algorithm {name!r}: replies = True needs keeps_client_state = True (client_finish "
                              f"updates the clients' states with the reply)")
        return ALGORITHMS.register(name)(target)
    return decorate


def from_keywords(cls: type, params: AlgorithmParams, **arguments) -> Algorithm:
    """The built-ins' constructors take (lr_local, lr_global, **keys): the section's own keys (and
    agg_weighting where it applies) as keywords, with `arguments` (values pinned by the name, or
    taken from the context) besides."""
    keys = params.model_dump(exclude={"name", "lr_local", "lr_global", *(() if cls.weighted else ("agg_weighting",))})
    return cls(params.lr_local, params.lr_global, **keys, **arguments)


def build_algorithm(params: AlgorithmParams, context: AlgorithmContext = AlgorithmContext()) -> Algorithm:
    """The algorithm that the `algorithm:` section `params` names."""
    return ALGORITHMS.get(params.name).target.from_params(params, context)


def undeclared_state_class(algorithm: Algorithm, state: Any) -> type | None:
    """The first class inside `state` (dataclass fields and containers, recursively) that the
    algorithm does not list in `state_classes`, or None."""
    if state is None or isinstance(state, (Tensor, int, float, bool, str)):
        return None
    if isinstance(state, (list, tuple, set, frozenset)):
        items = state
    elif isinstance(state, dict):
        items = state.values()
    else:
        if type(state) not in algorithm.state_classes:
            return type(state)
        items = vars(state).values()
    return next((found for item in items if (found := undeclared_state_class(algorithm, item)) is not None), None)


def check_state_declared(algorithm: Algorithm, name: str, state: Any, role: str) -> None:
    found = undeclared_state_class(algorithm, state)
    if found is not None:
        declared = ", ".join(cls.__name__ for cls in algorithm.state_classes) or "none"
        raise ConfigError(f"algorithm {name!r} returned a {role} state of class {found.__name__}, which its "
                          f"state_classes do not list ({declared}); add it there, so checkpoints can hold it")


def weighted_average(uploads: dict[int, Upload] | CombinedUploads, name: str, weighting: str,
                     weights: dict[int, float] | None = None, divisor: int | None = None) -> Tensor:
    """sum_i w_i * uploads[i].tensors[name] in client-id order; w_i = the selector's `weights` when
    given, else 1/S or n_i / sum_j n_j. `divisor` replaces S in the uniform average: MIFA's average over
    all N clients divides the round's sum by N. Under engine.partial_sums `uploads` is their exact sum
    (SummedUploads), divided once; under an aggregation.rule other than mean, the rule's output
    (rayfed.aggregation.RobustUploads); under central privacy, the noised sum (rayfed.privacy.central)."""
    if divisor is not None and weighting != "uniform":
        raise ValueError(f"weighted_average: a divisor applies to the uniform average, not to {weighting}")
    if isinstance(uploads, CombinedUploads):
        return uploads.average(name, weighting, weights, divisor)
    total = torch.zeros_like(next(iter(uploads.values())).tensors[name])
    if weights is not None:
        for client, upload in uploads.items():
            total.add_(upload.tensors[name], alpha=weights[client])
        return total
    if weighting == "uniform":
        for upload in uploads.values():
            total.add_(upload.tensors[name])
        return total.div_(len(uploads) if divisor is None else divisor)
    num_samples = sum(upload.num_samples for upload in uploads.values())
    for upload in uploads.values():
        total.add_(upload.tensors[name], alpha=upload.num_samples / num_samples)
    return total


class ClientStates(list):
    """The states of a stack of clients (engine.vectorize), one per client in the stack's order, as
    `client_train` takes them in place of one client's state: None for a client without one."""


def client_rows(client_state: Any, read: Callable[[Any], Tensor], default: Tensor) -> Tensor:
    """`read(client_state)`, or `default` where there is no state; for ClientStates, one such row per
    client, stacked."""
    if not isinstance(client_state, ClientStates):
        return default if client_state is None else read(client_state)
    return torch.stack([default if state is None else read(state) for state in client_state])


def per_client(client_state: Any, make: Callable[..., Any], **rows: Tensor) -> Any:
    """The new client state `make(**rows)`; where `client_state` is ClientStates (a stack of clients),
    one state per client, made of its own row of each of `rows` (a copy, so no state holds the stack)."""
    if not isinstance(client_state, ClientStates):
        return make(**rows)
    return ClientStates(make(**{name: stacked[row].clone() for name, stacked in rows.items()})
                        for row in range(len(client_state)))


def local_descent(task: ClientTask, start: Tensor, lr: float, direction: Callable[[Tensor, Tensor, int], Tensor],
                  output_loss: OutputLoss | None = None) -> tuple[Tensor, float | Tensor]:
    """task.steps steps x <- x - lr_t * direction(g, x, k) from `start`, k = 1, 2, ..., with the
    round's decayed rate lr_t = lr * task.lr_factor: the loop every local optimizer shares. g is the
    minibatch gradient of cross-entropy, or of `output_loss` (algorithms.objective) when given.
    Returns the final iterate (the resident model's vector, updated in place) and the mean
    minibatch loss over the steps. With a stack of clients (a ClientBatchTask) the iterates are
    (clients, d) and the losses a (clients,) tensor."""
    params = task.start_from(start)
    lr = lr * task.lr_factor
    loss_sum = 0.0
    for step in range(1, task.steps + 1):
        batch = task.next_batch()
        if output_loss is None:
            loss, grad = task.loss_and_grad(params, batch)
        else:
            loss, grad = task.objective_loss_and_grad(params, batch, output_loss)
        step_direction = direction(grad, params, step)
        task.decay(params, lr)
        params.sub_(step_direction, alpha=lr)
        loss_sum = loss_sum + loss.double()
    mean_loss = loss_sum / task.steps
    return params, float(mean_loss) if mean_loss.ndim == 0 else mean_loss


def local_sgd(task: ClientTask, start: Tensor, lr: float,
              objective: LocalObjective = LocalObjective()) -> tuple[Tensor, float | Tensor]:
    """Plain SGD steps from `start` (local_descent) on a local objective: by default the client's
    mean cross-entropy F_i(w); FedProx's adds Proximal(mu, x)."""
    return local_descent(task, start, lr, objective.direction, objective.output_loss)
