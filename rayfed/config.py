"""The config's schema: typed sections (pydantic models) whose defaults are the embedded quick-start,
the `algorithm:` section validated by the Params of the algorithm it names, YAML files and dotted
`key=value` overrides read into it, and what pydantic reports turned into one line that names the
dotted key and what it admits (rayfed.errors.ConfigError, exit code 2).

It declares keys and nothing else: it imports nothing of rayfed but the typed fields, the
registries (whose names some keys take) and the algorithm section's common keys. Whatever needs
the world (plugins, datasets, models, memory, trackers) is checked by rayfed.preflight, which
`rayfed.load_config` runs."""
import difflib
import math
import os
import typing
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, model_serializer,
                      model_validator)
from pydantic_core import PydanticCustomError

from rayfed.algorithms.params import AlgorithmParams, common_keys
from rayfed.errors import ConfigError, show
from rayfed.fields import MAX_COEFFICIENT, Flag, Names, allowed_values, count, number, read_float
from rayfed.input_files import parse_yaml, read_yaml
from rayfed.registry import (AGGREGATION_RULES, ALGORITHMS, ATTACKS, COMPRESSORS, DATASETS, MODELS, PARTITIONERS,
                             PRIVACY_MECHANISMS, SELECTORS, Registry, did_you_mean)

BACKENDS = ("local", "ray")
PLACEMENTS = ("default", "spread")
SERVER_PROCESSES = ("actor", "driver")
WORKER_LOSSES = ("continue", "replay")
ROUND_POLICIES = ("sync", "deadline", "overcommit", "async_buffered")
STALENESS_WEIGHTS = ("none", "sqrt")
WEIGHT_DECAY_MODES = ("coupled", "decoupled")
INTERVALS = ("fixed", "adaptive")
INTERVAL_ROUNDINGS = ("floor", "ceil")
INTERVAL_UNITS = ("epochs", "steps")
# The choices of keys whose components are not registries: the availability models
# (rayfed.systems.availability), the image scalings (rayfed.data.datasets) and UCS's weightings
# (rayfed.selection.selectors) each read theirs from here.
AVAILABILITIES = ("always", "bernoulli", "markov", "trace")
NORMALIZATIONS = ("channel", "half")
UCS_VARIANTS = ("paper", "reference_code")
PRIVACY_SCOPES = ("central", "local")
PRIVACY_ACCOUNTANTS = ("rdp", "pld", "prv")
# engine.cpu_isa: the x86 instruction sets ATen accepts as ATEN_CPU_CAPABILITY (rayfed.provenance applies them).
CPU_ISAS = ("default", "avx2", "avx512")
# The adaptive interval's defaults: FedLALR's (k_init, k_alpha) = (4, 2) setting (arXiv:2309.09719, Sec. V-D).
INTERVAL_DEFAULTS = {"interval_k_init": 4, "interval_k_alpha": 2.0, "interval_rounding": "floor",
                     "interval_unit": "epochs"}

# int16 codes: QSGD's signed levels and the affine quantizers' codes must fit.
MAX_QSGD_LEVELS = 32767
MAX_CODE_BITS = 16
MAX_ZERO_POINT_NOISE = 2 ** 15
MAX_RULE_ITERATIONS = 10**6
MAX_ADVERSARIES = 10**7

# CACS's warm-up (FedMoS, Wang et al., INFOCOM 2023, Sec. IV-C): T_e = 4 rounds with every client, K = M clusters, then
# training restarts from the initial model.
CACS_DEFAULTS = {"cacs_warmup_rounds": 4, "cacs_clusters": None, "cacs_continue_from_warmup": False}

# Bounds far above any real run, so that a typo fails here instead of exhausting memory or
# overflowing later: counts of clients, rounds, steps and samples...
MAX_SEED = 2**63 - 1
MAX_PLUGINS = 64
MAX_CALLBACKS = 64
MAX_WIDTH = 10**9               # a hidden layer; the memory check decides whether the model fits
MAX_LAYERS = 64
MAX_WORKERS = 4096
MAX_WORKER_CPUS = 1024.0
MAX_GPUS = 1024.0
MAX_RESTARTS = 1000
MAX_SERVER_RESTARTS = 100
MAX_FAULTS = 1000
# ...log-normal spreads: exp(5 sigma) is already a factor of 10^10 between clients...
MAX_SPREAD = 5.0
MAX_SYNTHETIC_SPREAD = 1e3
MAX_OVERCOMMIT = 100.0
# ...and wall-clock waits, which Python's timers take up to about 9e9 seconds.
MAX_ROUND_TIMEOUT_S = 1e6
MAX_CONNECT_TIMEOUT_S = 3600.0
MAX_STATE_MEMORY_MB = 1e12
# File names and paths as Linux limits them (NAME_MAX, PATH_MAX).
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


def path_problem(value: str) -> str | None:
    if "\0" in value:
        return "contains a NUL byte, which no file name can hold"
    try:
        encoded = os.fsencode(value)
    except UnicodeEncodeError:
        return "is not a valid file name (it holds an unpaired surrogate)"
    if len(encoded) > MAX_PATH_BYTES:
        return f"is {len(encoded)} bytes long; a path may be at most {MAX_PATH_BYTES}"
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > MAX_NAME_BYTES:
        return f"has a name of {longest} bytes; a file or folder name may be at most {MAX_NAME_BYTES}"
    return None


def check_path(key: str, value: str) -> None:
    """ConfigError unless `value` can name a file: no NUL byte, no name over 255 bytes, at most
    4096 bytes in all (beyond those, the operating system fails with an error of its own)."""
    problem = path_problem(value)
    if problem:
        raise ConfigError(f"{key}={show(value)} {problem}")


def _valid_path(value: str) -> str:
    problem = path_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError("must be printable text (no control characters)")
    return value


def _gpu_share(value: float) -> float:
    if value > 1 and value != int(value):
        raise ValueError("must be >= 0, and a whole number when above 1")
    return value


_Path = Annotated[str, Field(strict=True), AfterValidator(_valid_path)]
# A plugin component's own key in a section's `options`.
_OptionName = Annotated[str, Field(strict=True, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=100)]
_Text = Annotated[str, Field(strict=True, max_length=MAX_PATH_BYTES), AfterValidator(_printable)]
_Gpus = Annotated[number(ge=0.0, le=MAX_GPUS), AfterValidator(_gpu_share)]


def registered(registry: Registry, *also: str):
    """A name of `registry` (or one of `also`, such as "auto"), checked when the config is validated,
    so that names registered by plugins are taken as the built-in ones are."""
    names = Names(registry, also)

    def check(value: str) -> str:
        if value not in also and value not in registry:
            raise PydanticCustomError("registered_name", "not a registered name", {"choices": names.choices()})
        return value
    return Annotated[str, Field(strict=True), AfterValidator(check), names]


# "auto": the dataset's own clients (natural) where it has them, else dirichlet; the dataset's model.
_PartitionName = registered(PARTITIONERS, "auto")
_ModelName = registered(MODELS, "auto")


class _Section(BaseModel):
    # No validation on assignment: resolve() validates the whole config again, and code may
    # assign freely in between (the local engine's num_workers, the vectorize fallback).
    # Each key's docstring is its description: the config reference is generated from it.
    model_config = ConfigDict(extra="forbid", validate_assignment=False, use_attribute_docstrings=True)


class DataConfig(_Section):
    """The data: which dataset, where its files are, and how its samples are split among the clients."""

    dataset: registered(DATASETS) = "synthetic"
    """A registered dataset, built in or a plugin's: Datasets gives each one's source, files under `data.root`,
    classes and default model."""
    root: _Path = "./data"
    """Where the torchvision datasets' files and LEAF's Shakespeare files are (see Datasets)."""
    download: Flag = False
    """Download missing torchvision files into `data.root` (needs network); it cannot fetch `shakespeare`, and says so
    in one line."""
    num_clients: count(gt=0) = 100
    """N, the simulated clients."""
    partition: _PartitionName = "auto"
    """`natural` (synthetic's own clients), `iid`, `dirichlet`, `feddyn`, `moon`, `shards`, `fedmos` (see Partitions
    under Datasets); `fedmos` is FedMoS's label-skewed split (Wang et al., INFOCOM 2023, Sec. V-A): clients hold
    10–50 samples of 2 classes, or on `cifar10` a fixed size list of 5 classes each, which needs
    `data.num_clients=500`; `auto` is `natural` for synthetic, shakespeare (its speaking roles) and femnist (its
    writers) and `dirichlet` otherwise; shakespeare and femnist take only `natural` and `iid`."""
    alpha: number(gt=0.0, le=MAX_COEFFICIENT) = 0.1
    """Dirichlet concentration (ω of `dirichlet`, the prior's and shares' concentration of `feddyn` and `moon`;
    FedLALR uses 0.6 and 0.3): smaller is more heterogeneous."""
    shards_per_client: count(gt=0) = 2
    """Classes-per-client shards for `shards`."""
    synthetic_alpha: number(ge=0.0, le=MAX_SYNTHETIC_SPREAD) = 1.0
    """Synthetic(α, β): spread of the client models (0 to 1000)."""
    synthetic_beta: number(ge=0.0, le=MAX_SYNTHETIC_SPREAD) = 1.0
    """Synthetic(α, β): spread of the client feature means (0 to 1000)."""
    # A client needs a training and a test sample.
    synthetic_max_samples: count(ge=2) = 1000
    """Synthetic: cap on a client's sample count (train + test)."""
    synthetic_test_clients: count(gt=0) = 1000
    """`synthetic_lazy`: the clients whose test samples (their last 10%) form the test set, drawn once from the
    seed; all clients when `data.num_clients` is smaller. Bounds evaluation at any N."""
    shakespeare_train_samples: count(gt=0) = 2000
    """Shakespeare: each client's crop of training samples (FedDyn's size, as FedLALR, arXiv:2309.09719, Sec. V-C,
    uses it); with `natural` only roles with at least this many qualify."""
    shakespeare_test_samples: count(gt=0) = 400
    """Shakespeare: each client's crop of test samples; the test set is the union of the clients' crops (N × this
    many)."""
    augment: Flag = False
    """Image datasets: each training minibatch is randomly cropped from its 4-pixel zero-padded images and randomly
    mirrored left-right (see Datasets); an error with `synthetic` and `shakespeare`."""
    normalize: Literal[NORMALIZATIONS] = "channel"
    """How the torchvision image datasets are scaled: by their per-channel mean and std (`channel`), or to [−1, 1]
    (`half`: Normalize(0.5, 0.5), FedMoS's CIFAR preprocessing; its MNIST one is `channel`); an error for other
    datasets."""


class ModelConfig(_Section):
    """The model every client trains and the server aggregates."""

    name: _ModelName = "auto"
    """`logreg`, `mlp`, `lenet5`, `vgg11`, `cnn8` (a small CNN for images of at least 8x8: two 3x3 conv blocks with
    BatchNorm and 2x2 max-pooling, 16 and 32 channels, then FC 64; d = 13,802 on digits), `convmixer`
    (ConvMixer-256/8 with kernel 5 and patch 2, FedLALR's CIFAR model, arXiv:2309.09719, Sec. V-A; its global
    pooling is a plain mean, as VGG-11's; d = 594,186 on CIFAR-10), `char_lstm` (FedDyn's Shakespeare model:
    Embedding(80, 8), a 2-layer LSTM of 100 units, Linear(100, 80) on the last position; d = 133,520; the only
    model for `shakespeare`, and it fits nothing else), `mnist_cnn` (FedMoS's MNIST CNN: conv 10 and 20 channels
    with Dropout2d, FC 50 with dropout; d = 21,840 on MNIST), `cifar_cnn3fc` (FedMoS's CIFAR model as its paper
    describes it: LeNet-5 with FC 120-84; d = 62,006 on CIFAR-10), `cifar_cnn_ref` (as the authors' code has it:
    convs 32-64-64 with dropout 0.2, FC 64; d = 122,570); `relu_mlp` (Linear and ReLU per hidden layer, no
    BatchNorm: FedCOM's MLP, 784-200-200-10 with `model.hidden_sizes=[200, 200]`, d = 199,210); `resnet20` (He et
    al.'s CIFAR ResNet-20 with projection shortcuts, any image of at least 8x8; d = 272,474 on CIFAR-10, 284,824 on
    Tiny-ImageNet; it has a page of its own under Models); `auto` is logreg for synthetic, mlp for MNIST-like, mnist_5k and
    digits, lenet5 for CIFAR-10, vgg11 for CIFAR-100, resnet20 for tiny_imagenet, char_lstm for shakespeare,
    relu_mlp for femnist."""
    hidden_sizes: Annotated[list[count(gt=0, le=MAX_WIDTH)], Field(strict=True, max_length=MAX_LAYERS)] = \
        Field(default_factory=lambda: [200, 100])
    """Hidden widths of `mlp` (each Linear is followed by BatchNorm and ReLU) and `relu_mlp` (by ReLU alone); at most
    64 layers."""


# The algorithm section: its common keys, and the chosen algorithm's own (rayfed.algorithms.params).
AlgorithmConfig = AlgorithmParams
# The quick-start's algorithm, where a config names none.
DEFAULT_ALGORITHM = "fedavgm"


class TrainConfig(_Section):
    """Rounds, local work, evaluation, round policies and when to stop or checkpoint."""

    rounds: count(gt=0) = 1000
    """T, the rounds to train."""
    clients_per_round: count(gt=0) = 10
    """S, sampled uniformly without replacement each round."""
    local_steps: count(gt=0) = 5
    """I (K): local minibatch steps per client per round."""
    local_epochs: Optional[count(gt=0)] = None
    """Instead of `train.local_steps`: E passes over the client's data, ⌈n_i / B⌉ steps each (clients of different
    sizes then take different step counts)."""
    batch_size: count(gt=0) = 64
    """B; a client with fewer samples uses all of them as one batch."""
    lr_decay: number(gt=0.0, le=1.0) = 1.0
    """γ in (0, 1]: round t's client learning rate is η_l γᵗ, for every algorithm (FedLALR's experiments: 0.998);
    server learning rates stay constant."""
    weight_decay: number(ge=0.0, le=MAX_COEFFICIENT) = 0.0
    """λ of every algorithm's local steps."""
    weight_decay_mode: Literal[WEIGHT_DECAY_MODES] = "coupled"
    """`coupled`: g ← g + λx before the optimizer (torch's `weight_decay`); `decoupled`: x ← (1 − η_l,t λ) x before
    each step (AdamW's)."""
    max_grad_norm: Optional[number(gt=0.0, le=MAX_COEFFICIENT)] = None
    """Clip each local gradient to this L2 norm (torch's `clip_grad_norm_`) before weight decay; `null`: no clipping."""
    interval: Literal[INTERVALS] = "fixed"
    """`adaptive`: K_t = k_init + ROUND(log_{k_alpha} t) for 1-based round t (FedLALR, arXiv:2309.09719, Sec. IV-C),
    replacing `train.local_steps`."""
    interval_k_init: Optional[count(gt=0)] = None
    """k_init of `adaptive` (default 4)."""
    interval_k_alpha: Optional[number(gt=1.0, le=MAX_COEFFICIENT)] = None
    """k_alpha > 1 of `adaptive` (default 2)."""
    interval_rounding: Optional[Literal[INTERVAL_ROUNDINGS]] = None
    """`floor` (default; the paper's text: K = 10 for rounds 64–100 with (4, 2)) or `ceil` (its printed formula)."""
    interval_unit: Optional[Literal[INTERVAL_UNITS]] = None
    """What K_t counts: `epochs` (default) or `steps`."""
    eval_every: count(gt=0) = 10
    """Evaluate the global model on the test set every this many rounds (and after the last)."""
    eval_train_loss: Flag = False
    """Also evaluate the global model, in eval mode, on the union of the clients' training samples at every
    evaluation: `global_train_loss` (FedMoS's training loss Σ_i p_i f_i(x^t), p_i = D_i / Σ D_j) and
    `global_train_accuracy` in `metrics.jsonl`."""
    similarity_clients: count(ge=0) = 0
    """n > 0: at every evaluation, clients 0 … n−1 send their full local gradient at the global model and
    `metrics.jsonl` gets `gradient_similarity` (their n × n cosine matrix) and `gradient_similarity_mean` (off the
    diagonal): FedCOM's heterogeneity diagnostic (arXiv:2007.01154, Eq. 7)."""
    round_policy: Literal[ROUND_POLICIES] = "sync"
    """`sync` (wait for every sampled client), `deadline` (late uploads do not count), `overcommit` (sample more, keep
    the first S), `async_buffered` (FedBuff)."""
    deadline_s: Optional[number(gt=0.0)] = None
    """The deadline in virtual seconds, for `deadline`."""
    overcommit: number(ge=0.0, le=MAX_OVERCOMMIT) = 0.3
    """Extra fraction sampled by `overcommit`: ⌈S (1 + overcommit)⌉; at most 100."""
    concurrency: Optional[count(gt=0)] = None
    """`async_buffered`: clients training at once (default: `train.buffer_size`)."""
    buffer_size: Optional[count(gt=0)] = None
    """`async_buffered`: arrivals per server update (default: `train.clients_per_round`)."""
    staleness_weight: Literal[STALENESS_WEIGHTS] = "none"
    """`async_buffered`: `sqrt` weights an update of staleness τ by 1/√(1+τ) (FedBuff); FedAvg family only."""
    checkpoint_every: count(ge=0) = 0
    """Write `checkpoint.pt` into the run directory every this many rounds (0: never)."""
    target_accuracy: Optional[number(gt=0.0, le=1.0)] = None
    """Stop at the first evaluated round whose test accuracy is at least this; `summary.json` then says `status:
    reached_target` and `target_round`."""
    target_loss: Optional[number(gt=0.0)] = None
    """Stop at the first evaluated round whose test loss is at most this (with `train.target_accuracy` too: the first
    round that reaches both)."""
    target_epsilon: Optional[number(gt=0.0, le=MAX_COEFFICIENT)] = None
    """Stop before the round that would take the privacy spent (privacy.*) above this ε (status
    `privacy_budget_spent`)."""
    max_sample_gradients: Optional[number(gt=0.0, le=1e30)] = 1e11
    """A bound on the run's work, in sample gradients (rounds x clients per round x local steps x samples a step,
    with CACS's warm-up): a config above it is refused before it starts (a typo of 10000000 local epochs would run for
    months); `null`: no bound. Runs above 1e9 say their estimate when they start."""


class SystemsConfig(_Section):
    """The simulated devices on the virtual clock: when clients are online, how fast they compute and communicate."""

    availability: Literal[AVAILABILITIES] = "always"
    """Who can be sampled: `always`, `bernoulli`, `markov`, `trace`."""
    online_probability: number(gt=0.0, le=1.0) = 0.8
    """`bernoulli`: mean of the per-client online probabilities."""
    online_concentration: number(gt=0.0, le=MAX_COEFFICIENT) = 10.0
    """`bernoulli`: the per-client probabilities are Beta(p κ, (1 − p) κ); larger κ, less spread."""
    mean_online_s: number(gt=0.0) = 600.0
    """`markov`: mean length of an online period, virtual seconds."""
    mean_offline_s: number(gt=0.0) = 600.0
    """`markov`: mean length of an offline period."""
    trace: Optional[_Path] = None
    """`trace`: a CSV of online intervals (see Stragglers and availability)."""
    step_time_s: number(gt=0.0) = 0.05
    """Median virtual seconds per local step."""
    step_time_spread: number(ge=0.0, le=MAX_SPREAD) = 0.0
    """Log-normal spread σ of the per-client step times (0: all equal; at most 5)."""
    upload_bps: number(gt=0.0) = 1.0e6
    """Median upload bandwidth, bytes per virtual second."""
    download_bps: number(gt=0.0) = 1.0e7
    """Median download bandwidth."""
    bandwidth_spread: number(ge=0.0, le=MAX_SPREAD) = 0.0
    """Log-normal spread σ of the per-client bandwidths (at most 5)."""
    speed_trace: Optional[_Path] = None
    """A CSV `client_id,step_time_s,upload_bps,download_bps` of measured speeds; clients it lists use them, the others
    the log-normal model."""
    idle_wait_s: number(gt=0.0) = 60.0
    """Virtual seconds the server waits when no client could be sampled, before asking again."""


class EngineConfig(_Section):
    """Where the simulation runs: in this process or as Ray actors, with how many workers, CPUs and GPUs."""

    backend: Literal[BACKENDS] = "ray"
    """`ray`: server and workers as Ray actors; `local`: all in this process."""
    num_workers: count(gt=0, le=MAX_WORKERS) = 2
    """P ClientWorker actors; client i's state lives on worker i mod P (clients without state are dealt out evenly
    each round); at most 4096."""
    worker_cpus: number(gt=0.0, le=MAX_WORKER_CPUS) = 1.0
    """CPUs per worker actor; also each process's torch thread count; at most 1024."""
    worker_gpus: _Gpus = 0.0
    """GPUs per worker actor; fractions share a GPU (`0.25`: four workers per GPU); above 1 a whole number, at most
    1024."""
    server: Literal[SERVER_PROCESSES] = "actor"
    """Ray: where the server runs. `actor`: its own actor, recreated from the last checkpoint when it dies; `driver`:
    in the driver's process, one process and two hops between processes a round fewer (see Performance)."""
    server_gpus: Optional[_Gpus] = None
    """GPUs reserved for the server: the global model, the memory D, its Gram matrix, the server QP and the evaluation
    then live on the GPU (in the driver, its own GPU, which Ray does not reserve). Unset: on a GPU when the workers
    are (`engine.worker_gpus > 0`), sharing its node's GPU with them without reserving any; `0`: on the CPU."""
    address: Optional[_Text] = None
    """A Ray cluster to join; unset, `RAY_ADDRESS` is used, else a private local instance is started."""
    round_timeout_s: Optional[number(gt=0.0, le=MAX_ROUND_TIMEOUT_S)] = None
    """Ray: wall-clock seconds to wait for the workers each round; a late worker's clients are that round's
    stragglers; at most 1e6."""
    connect_timeout_s: number(gt=0.0, le=MAX_CONNECT_TIMEOUT_S) = 30.0
    """Seconds to wait for the Ray cluster at `engine.address` / `RAY_ADDRESS` before giving up with exit 2; at most
    3600."""
    worker_max_restarts: count(ge=0, le=MAX_RESTARTS) = 3
    """Ray: how often Ray restarts a worker actor that died (killed, out of memory); at most 1000."""
    server_max_restarts: count(ge=0, le=MAX_SERVER_RESTARTS) = 3
    """Ray: how often the run recreates a server actor that died, from the last checkpoint, within one run; at most
    100."""
    fault_injection: Annotated[list[Annotated[str, Field(strict=True)]], Field(strict=True, max_length=MAX_FAULTS)] = \
        Field(default_factory=list)
    """Ray, for testing: `kill:WORKER:ROUND[:WHEN]` ends a worker's process, `delay:WORKER:ROUND:SECONDS` stalls it,
    `kill_server:ROUND[:WHEN]` ends the server's (ROUND 1-based; see What survives what)."""
    vectorize: Flag = False
    """A worker trains its sampled clients of a round as one batched computation (`torch.func.vmap`): see Performance."""
    partial_sums: Flag = False
    """A worker sends one exact sum per upload name over its clients instead of each client's upload, and the server
    adds the workers' sums: the same bits for any `engine.num_workers` and either backend, within float32 rounding of
    the default path; for algorithms whose server step only averages the uploads, uniform selection, no compression
    and a synchronous round policy (see Performance)."""
    state_memory_mb: Optional[number(ge=0.0, le=MAX_STATE_MEMORY_MB)] = None
    """Memory for the clients' persistent states (SCAFFOLD's control variates, MIFA's latest updates, ...), in MB of
    10^6 bytes: when N x the algorithm's floats per client x 4 bytes exceeds it, each worker keeps its clients' states
    in one file under `engine.state_dir` instead, with the same bits; unset: what the machine's memory leaves after
    the rest of the run. Checked before round 1, with the free disk (see Large N)."""
    state_dir: Optional[_Path] = None
    """Where spilled client states live, one file per worker (default: `client_states/` in the run directory); a local
    disk with room for all N clients' states, and twice that in the run directory's disk for checkpoints. On a Ray
    cluster each worker's file is on its own node: a path every node can create (see Large N)."""
    placement: Literal[PLACEMENTS] = "default"
    """Ray: where the worker actors go. `default`: Ray's default scheduling (it fills a node to half its CPUs before it
    moves on); `spread`: over as many nodes as possible (Ray's SPREAD strategy, soft: a worker Ray restarts after its
    node died goes to any node with room). Either way the server runs on the driver's node (a server actor
    with `engine.server_gpus` goes where Ray finds them); in a sweep the trial's placement group holds both (see Run on
    a Ray cluster)."""
    reuse_actors: Flag = False
    """Ray: when the run ends normally, keep its server and workers that never died for the next run in this Python
    process on the same Ray with the same actor options (a loop over configs, a notebook, a test suite): it builds
    them for its own config instead of starting processes, seconds each. They hold their CPUs and GPUs while they
    wait, until the next ray run that does not take them, a sweep, `rayfed.release_actors()` or `ray.shutdown()` ends
    them. No effect on a private Ray instance, which ends with the run, or in a sweep's trial (see Performance)."""
    worker_loss: Literal[WORKER_LOSSES] = "continue"
    """Ray: what a round in which a worker (or a whole node) died becomes. `continue`: it completes without the dead
    worker's clients and the run goes on, those clients' states back at the last checkpoint; `replay`: the run goes
    back to the last checkpoint (or the start) and plays the rounds since again, so it ends with the bits of an
    uninterrupted run (see What survives what)."""
    cpu_isa: Optional[Literal[CPU_ISAS]] = None
    """Caps the CPU kernels of PyTorch, MKL and oneDNN at an x86 instruction set every node has (`default`, `avx2`,
    `avx512`), in the driver and in every actor, so that processors of different kinds give one kind's bits; unset:
    each process takes its processor's best. `rayfed run` sets the caps; a Python driver must start with them in its
    environment (see Reproducibility)."""


class SelectionConfig(_Section):
    """Whom the server trains each round among the online clients, and with what weights."""

    selector: registered(SELECTORS) = "uniform"
    """Whom the server trains each round, among the online clients (see Client selection): `uniform` (S uniformly
    without replacement; the algorithm weights them), `poisson` (each with probability S/N_online; the algorithm
    weights them), `md` (S draws ∝ sample counts, w = count/S), `acs` (FedMoS's
    Algorithm 2, w = count/S), `ucs` (S uniformly, w = (N_online/S) p_i), `cacs` (acs in the order of clusters of
    similar clients, after a warm-up)."""
    ucs_variant: Literal[UCS_VARIANTS] = "paper"
    """`ucs`: `paper` (Eq. 28's unnormalised weights) or `reference_code` (the authors' code: S without replacement ∝
    p, w = p_i / Σ_S p_j)."""
    # cacs only; None: not set, CACS_DEFAULTS when selector=cacs.
    cacs_warmup_rounds: Optional[count(ge=0)] = None
    """`cacs`: T_e, warm-up rounds with every client before the clients are clustered (default 4; 0: cluster the
    gradients at the initial model)."""
    cacs_clusters: Optional[count(gt=0)] = None
    """`cacs`: K, the clusters the dendrogram is cut into (default: `train.clients_per_round`)."""
    cacs_continue_from_warmup: Optional[Flag] = None
    """`cacs`: `true` starts training from the warm-up's model and server state instead of the initial ones."""


class CompressionConfig(_Section):
    """How a client's upload is encoded on its way to the server."""

    name: registered(COMPRESSORS) = "identity"
    """How a client's model update is encoded on its way to the server (see Compression): `identity` (32-bit floats),
    `qsgd` (s-level stochastic quantizer), `rand_k` (k random coordinates scaled by d/k), `top_k` (the k largest),
    `affine` (FedTorch's b-bit quantizer with zero-point, the paper's), `affine_stochastic` (b-bit levels with
    unbiased rounding); for `fedavg`-family, `fedadam`-family and `fedmos` uploads."""
    # Each operator's own keys (None: not set; the defaults its registration declares): QSGD's levels s,
    # a sparsifier's k (kept) or C_r (ratio, k = floor(C_r d / 2)), an affine quantizer's bits b and
    # AffineNoisy's zero-point noise N_z.
    levels: Optional[count(gt=0, le=MAX_QSGD_LEVELS)] = None
    """`qsgd`: s, its levels (default 4; at most 32767)."""
    kept: Optional[count(gt=0)] = None
    """`rand_k`, `top_k`: k, the coordinates sent (capped at d); instead of `ratio`."""
    ratio: Optional[number(gt=0.0, le=1.0)] = None
    """`rand_k`, `top_k`: C_r, with k = ⌊C_r d / 2⌋, so that values and int32 indices take C_r of 32d bits (default 0.1
    unless `kept` is set)."""
    bits: Optional[count(gt=0, le=MAX_CODE_BITS)] = None
    """`affine`, `affine_stochastic`: b, bits a code (default 8; at most 16)."""
    zero_point_noise: Optional[count(ge=0, le=MAX_ZERO_POINT_NOISE)] = None
    """`affine`: N_z (default 0): codes are made with zero-point z + ζ, ζ uniform in {−N_z..N_z} once a message, and decoded with z (the
    paper's Fig. 9a noise)."""
    per_tensor: Flag = False
    """Compress each parameter tensor on its own (the authors' code; headers paid once a tensor) instead of the whole
    flat vector."""
    downlink: Flag = False
    """`fedcomgate`: compress the server's reply Δ̄ too, with the same operator and one draw from the server's stream;
    the decoded value moves both the model and every client's tracking (an experiment knob, not in the paper's
    Algorithm 2; it breaks Σ_j δ_j = 0). Dense operators only."""


class AggregationConfig(_Section):
    """How the server combines the round's uploads before the algorithm's server step reads them."""

    rule: registered(AGGREGATION_RULES) = "mean"
    """`mean` (the algorithm's own weighted average), or a robust rule that replaces it for every upload the server
    step averages (see Robustness): `median`, `trimmed_mean`, `krum`, `multi_krum`, `bulyan`, `geometric_median`,
    `centered_clipping`; for algorithms whose server step reads the uploads only through their average."""
    # Each rule's own keys (None: not set; the defaults its registration declares, or required).
    num_byzantine: Optional[count(ge=0)] = None
    """`trimmed_mean`, `krum`, `multi_krum`, `bulyan`: f, the Byzantine inputs the rule is built to tolerate (trimmed
    at each end; Krum's n − f − 2 neighbours). Required by those rules."""
    multi_krum_m: Optional[count(gt=0)] = None
    """`multi_krum`: m, the uploads of lowest score averaged (default n − f)."""
    iterations: Optional[count(gt=0, le=MAX_RULE_ITERATIONS)] = None
    """`geometric_median`: the most Weiszfeld steps (default 100); `centered_clipping`: its L (default 1)."""
    tolerance: Optional[number(ge=0.0, le=1.0)] = None
    """`geometric_median`: stop once a step improves the objective by at most this fraction of it (default 1e-6)."""
    smoothing: Optional[number(gt=0.0, le=MAX_COEFFICIENT)] = None
    """`geometric_median`: ν, the least distance a Weiszfeld weight divides by (default 1e-6)."""
    clip_radius: Optional[number(gt=0.0, le=MAX_COEFFICIENT)] = None
    """`centered_clipping`: τ, the L2 radius around the previous aggregate. Required by that rule."""
    options: dict[_OptionName, number(ge=-MAX_COEFFICIENT, le=MAX_COEFFICIENT)] = Field(default_factory=dict)
    """A plugin rule's own keys, as its registration declares them (`register_rule(..., keys=...)`), e.g.
    `aggregation.options.alpha=0.5`; rayfed's rules take none."""
    bucket_size: count(gt=0) = 1
    """s: with s > 1 the rule combines the means of ⌈n / s⌉ random buckets of s uploads instead of the uploads
    (bucketing, Karimireddy et al., ICLR 2022), the permutation drawn once a round from the run's seed."""


class AdversaryConfig(_Section):
    """Byzantine clients: who they are and how they attack."""

    attack: registered(ATTACKS) = "none"
    """`none`, or what the adversaries do (see Robustness): `sign_flip`, `gaussian`, `label_flip`, `alie`, `ipm`,
    `mimic`."""
    fraction: Optional[number(ge=0.0, le=1.0)] = None
    """The adversaries as a fraction of N: round(fraction N) clients drawn once from the run's seed; or `clients`."""
    clients: Annotated[list[count(ge=0)], Field(strict=True, max_length=MAX_ADVERSARIES)] = Field(default_factory=list)
    """The adversaries by client id, instead of `fraction`."""
    noise_std: Optional[number(gt=0.0, le=MAX_COEFFICIENT)] = None
    """`gaussian`: σ of the noise sent (default 200, Xie et al.'s)."""
    alie_z: Optional[number(ge=-MAX_COEFFICIENT, le=MAX_COEFFICIENT)] = None
    """`alie`: z of μ + zσ (default: the paper's z_max from the round's n and m)."""
    ipm_epsilon: Optional[number(gt=0.0, le=MAX_COEFFICIENT)] = None
    """`ipm`: ε of −ε times the honest mean (default 0.1)."""
    options: dict[_OptionName, number(ge=-MAX_COEFFICIENT, le=MAX_COEFFICIENT)] = Field(default_factory=dict)
    """A plugin attack's own keys, as its registration declares them (`register_attack(..., keys=...)`), e.g.
    `adversary.options.scale=4`; rayfed's attacks take none."""


class PrivacyConfig(_Section):
    """User-level differential privacy: each client's upload clipped, noise added, the privacy spent accounted."""

    mechanism: registered(PRIVACY_MECHANISMS, "none") = "none"
    """`none`, `gaussian` (L2 clipping, N(0, (zC)²) noise) or `laplace` (L1 clipping, Laplace(zC) noise); see Privacy."""
    scope: Literal[PRIVACY_SCOPES] = "central"
    """`central`: the server clips every upload and noises their sum once a round; `local`: each client clips and
    noises its own upload before sending it."""
    clip_norm: Optional[number(gt=0.0)] = None
    """C, the norm each client's upload is clipped to (its initial value under adaptive clipping). Required."""
    per_layer: Flag = False
    """Clip each parameter tensor to C/√P (L1: C/P) over its P tensors instead of the whole upload to C."""
    noise_multiplier: Optional[number(ge=0.0, le=MAX_COEFFICIENT)] = None
    """z: the noise's scale over the sensitivity C; or set `target_epsilon`."""
    target_epsilon: Optional[number(gt=0.0, le=MAX_COEFFICIENT)] = None
    """Instead of `noise_multiplier`: the ε that train.rounds rounds should spend at `delta`; the run's z is solved
    for before it starts (and recorded in its config.yaml as `noise_multiplier`)."""
    delta: Optional[number(gt=0.0, lt=1.0)] = None
    """δ of the (ε, δ) guarantee the accountant reports. Required."""
    accountant: Literal[PRIVACY_ACCOUNTANTS] = "rdp"
    """`rdp` (Rényi DP, ε every round) or `pld` (privacy loss distributions, tighter; ε at evaluated rounds, about a
    second each), both Google's dp-accounting; or `prv` (privacy random variables, Gopi et al., NeurIPS 2021, the
    prv-accountant package, as pfl-research; its upper bound, at evaluated rounds)."""
    adaptive_clipping: Flag = False
    """Move C each round towards the `target_quantile` of the clients' update norms (Andrew et al., NeurIPS 2021),
    paying for the count it learns out of z; central scope, whole-upload clipping."""
    target_quantile: number(ge=0.0, le=1.0) = 0.5
    """γ, the fraction of clients whose updates adaptive clipping aims to leave unclipped."""
    clip_learning_rate: number(gt=0.0, le=MAX_COEFFICIENT) = 0.2
    """η_C of adaptive clipping's geometric update C ← C·exp(−η_C (b̄ − γ))."""
    clip_count_stddev: Optional[number(gt=0.0, le=MAX_COEFFICIENT)] = None
    """σ_b, the noise on adaptive clipping's count of unclipped clients (default S/20, the paper's)."""


# A callback as `logging.callbacks` names it: a registered name or an importable `module.Class`,
# alone or as {name: ..., other keys: the constructor's keyword arguments}.
_CallbackEntry = Union[Annotated[str, Field(strict=True)], dict[Annotated[str, Field(strict=True)], Any]]


class LoggingConfig(_Section):
    """What a run reports besides its run directory's own files."""

    tensorboard: Flag = False
    """Also write TensorBoard event files into the run directory: every numeric `metrics.jsonl` field per round (see
    What a run writes)."""
    mlflow: Flag = False
    """Also log the run to MLflow (`pip install "rayfed[mlflow]"`): the resolved config as params, every numeric
    metric per round with step = round, `config.yaml` and `summary.json` as artifacts; the store is
    `MLFLOW_TRACKING_URI`, else `./mlruns`."""
    mlflow_experiment: Optional[_Text] = None
    """The MLflow experiment; `null`: `rayfed`, or for a sweep's trials the sweep's name."""
    client_metrics: Flag = False
    """Also write `clients.jsonl`: one line per round and counted client with its sample count and every number it
    reported (the round's record holds their mean, min and max as `client_<name>_mean`, `_min`, `_max` either way)."""
    callbacks: Annotated[list[_CallbackEntry], Field(strict=True, max_length=MAX_CALLBACKS)] = \
        Field(default_factory=list)
    """Callbacks to run in the driver: registered names or importable `module.Class` paths, each alone or as `{name:
    ..., key: value}` with its constructor's keyword arguments."""


class PluginRecord(_Section):
    """A plugin as a run records it: a file by its absolute path, or a module by its name, with the SHA-256
    of the file it was imported from."""

    path: Optional[_Path] = None
    """A `.py` file (made absolute when the config is resolved)."""
    module: Optional[_Text] = None
    """An importable module name."""
    sha256: Optional[Annotated[str, Field(strict=True, pattern="^[0-9a-f]{64}$")]] = None
    """The file's SHA-256 when the run started: a file changed since is refused."""

    @model_serializer(mode="wrap")
    def _set_keys_only(self, handler):
        return {key: value for key, value in handler(self).items() if value is not None}

    @model_validator(mode="after")
    def _one_source(self):
        if (self.path is None) == (self.module is None):
            raise PydanticCustomError("plugin_record", "a plugin record names a path or a module (one of the two)")
        return self


class Config(_Section):
    seed: count(ge=0, le=MAX_SEED) = 0
    """Drives the data, the partition, the initial model, client sampling, minibatches and dropout; 0 to 2⁶³ − 1."""
    plugins: Annotated[list[Union[_Path, PluginRecord]], Field(strict=True, max_length=MAX_PLUGINS)] = \
        Field(default_factory=list)
    """Modules that register components of your own (algorithms, ...): importable module names or `.py` file paths,
    imported before the config is validated; see the plugins tutorial. A run's `config.yaml` records each as `{path:
    ABSOLUTE_PATH, sha256: ...}` or `{module: NAME, sha256: ...}`, so that a resume or re-run finds it from any
    directory, and refuses it if its file changed."""
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    # The registered algorithm's Params (a subclass), serialised with its own keys.
    algorithm: SerializeAsAny[AlgorithmConfig] = Field(default_factory=lambda: default_algorithm_section())
    train: TrainConfig = Field(default_factory=TrainConfig)
    systems: SystemsConfig = Field(default_factory=SystemsConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    compression: CompressionConfig = Field(default_factory=CompressionConfig)
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    adversary: AdversaryConfig = Field(default_factory=AdversaryConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="before")
    @classmethod
    def _algorithm_params(cls, data: Any) -> Any:
        """The `algorithm:` section is validated by the Params of the algorithm it names, from the keys
        given alone: a mapping built in Python gets the same defaults as a file."""
        if isinstance(data, dict) and "algorithm" in data and not isinstance(data["algorithm"], AlgorithmParams):
            try:
                return {**data, "algorithm": algorithm_section(data["algorithm"])}
            except ConfigError as error:
                raise PydanticCustomError("algorithm_section", str(error)) from None
        return data

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(warnings=False)

    def to_yaml(self) -> str:
        return yaml.dump(self.to_dict(), Dumper=_DUMPER, sort_keys=False)


# libyaml's emitter when PyYAML has it: the same text, about ten times faster than the pure-Python
# one, and `rayfed config`, each run's config.yaml and the config tests print whole configs.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)



def validate(raw: dict) -> Config:
    """The Config of a mapping of sections (as read_raw gives it), every key typed and in range."""
    raw = {**raw, "algorithm": algorithm_section(raw.get("algorithm", {}))}
    try:
        return Config.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(_message(error)) from None


def read_raw(path: str | os.PathLike | None = None, overrides: list[str] = ()) -> dict:
    """The sections' defaults (the quick-start's), then the YAML file at `path`, then `key=value`
    overrides, as a mapping not yet validated. The `algorithm:` section holds only the keys given:
    the Params of the algorithm it names fill in the rest, so that its own defaults (the common keys'
    included) are the run's, whichever algorithm the quick-start's section names."""
    raw = Config().to_dict()
    raw["algorithm"] = {}
    if path is not None:
        _merge(raw, _read_yaml(path), prefix="")
    for override in overrides:
        _apply_override(raw, override)
    return raw


def default_algorithm_section() -> AlgorithmParams:
    return ALGORITHMS.get(DEFAULT_ALGORITHM).target.Params(name=DEFAULT_ALGORITHM)


def algorithm_section(raw: Any) -> AlgorithmParams:
    """The `algorithm:` section validated by the Params of the algorithm it names. A key set to null
    is not set (the algorithm's default); a key of another algorithm, or none, is an error."""
    if isinstance(raw, AlgorithmParams):
        raw = raw.model_dump()
    if not isinstance(raw, dict):
        raise ConfigError(f"algorithm must be a mapping of keys ({', '.join(common_keys())}, ...)")
    name = raw.get("name", DEFAULT_ALGORITHM)
    if not isinstance(name, str) or name not in ALGORITHMS:
        raise ConfigError(f"algorithm.name={show(name)} is not one of: {', '.join(ALGORITHMS)}"
                          f"{did_you_mean(name, ALGORITHMS.names())}")
    algorithm = ALGORITHMS.get(name).target
    params = algorithm.Params
    takes = [key for key in params.model_fields if key != "name" and (algorithm.server_lr or key != "lr_global")]
    for key, value in raw.items():
        # null is "not set": a config.yaml written before per-algorithm sections lists every key so.
        if key in params.model_fields or (value is None and key in AlgorithmParams.known_keys):
            continue
        if key in AlgorithmParams.known_keys:
            raise ConfigError(f"algorithm.{key} is not a parameter of {name} (it takes "
                              f"{', '.join(f'algorithm.{k}' for k in takes)})")
        starting = [k for k in params.model_fields if k.startswith(str(key))]      # lr -> lr_local, as elsewhere
        close = starting[:1] or difflib.get_close_matches(str(key), list(params.model_fields), n=1)
        close = f" (did you mean {'algorithm.' + close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown key {show(f'algorithm.{key}')}{close}")
    try:
        section = params.model_validate({key: value for key, value in raw.items()
                                         if value is not None and key in params.model_fields})
    except ValidationError as error:
        raise ConfigError(_message(error, params, "algorithm.")) from None
    if not algorithm.server_lr and section.lr_global != 1.0:
        raise ConfigError(f"algorithm.lr_global does not apply to {name}, which has no server learning rate")
    if not algorithm.weighted and section.agg_weighting != "uniform":
        raise ConfigError(f"algorithm.agg_weighting={section.agg_weighting} does not apply to {name}, which does not "
                          f"weight its clients' uploads (its class does not declare weighted = True)")
    return section


# ---- messages ----

_TYPE_WORDS = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
               "string_type": "a string"}
_BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def _message(error: ValidationError, root: type[BaseModel] | None = None, prefix: str = "") -> str:
    """The first problem pydantic found, as one line naming the dotted key and what it admits;
    `root` is the model validated (default the whole Config), whose keys sit under `prefix`."""
    first = error.errors(include_url=False)[0]
    kind, value, context = first["type"], first["input"], first.get("ctx", {})
    key = prefix + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])[1:]
    declared = _declared(first["loc"], root or Config)
    if kind in ("algorithm_section", "plugin_record"):
        return first["msg"] if kind == "algorithm_section" else f"{key}: {first['msg']}"
    if kind == "extra_forbidden":
        return f"unknown key {show(key)}{_did_you_mean_key(key)}"
    if kind in _TYPE_WORDS:
        return f"{key} must be {_TYPE_WORDS[kind]}, got {show(value)} ({type(value).__name__})"
    if kind == "list_type":
        item = typing.get_args(_list_type(declared))[0]
        return f"{key} must be a list of {typing.get_args(item)[0].__name__}, got {show(value)}"
    if kind in ("model_type", "model_attributes_type"):
        return f"{key} must be a mapping of keys ({', '.join(declared.model_fields)})"
    if kind == "registered_name":
        choices = context["choices"]
        return f"{key}={show(value)} is not one of: {', '.join(choices)}{did_you_mean(value, choices)}"
    if kind == "literal_error":
        choices = typing.get_args(declared)
        if root is not None and first["loc"][0] not in common_keys():
            # An algorithm's own choice, worded as its ranges are.
            return f"{key}={show(value)} must be {allowed_values(declared)}"
        return f"{key}={show(value)} is not one of: {', '.join(choices)}{did_you_mean(value, choices)}"
    if kind == "finite_number" or kind in _BOUND_ERRORS:
        # Shown as the float it was read as (0 as 0.0, '1e3' as 1000.0), or as given when too large
        # for one. pydantic checks the bounds before finiteness, so a NaN fails "> 0" first.
        number = read_float(value) if typing.get_args(declared)[0] is float else value
        if isinstance(value, int) and number == math.inf:
            number = value
        if isinstance(number, float) and not math.isfinite(number):
            return f"{key}={show(number)} must be a finite number"
        return f"{key}={show(number)} must be {allowed_values(declared)}"
    if kind in ("too_long", "string_too_long"):
        return f"{key} may hold at most {context['max_length']} {'entries' if kind == 'too_long' else 'characters'}"
    if kind == "value_error":
        return f"{key}={show(value)} {context['error']}"
    return f"{key}={show(value)} is not allowed ({first['msg']})"


def _declared(loc: tuple, root: type[BaseModel]) -> Any:
    """The declared type at `loc`, without Optional, with the constraints of its Field(...): what its
    error message describes."""
    declared = root
    for part in loc:
        if isinstance(part, int):
            declared = typing.get_args(_list_type(declared))[0]
        elif isinstance(declared, type) and issubclass(declared, BaseModel) and part in declared.model_fields:
            field = declared.model_fields[part]
            declared = _non_optional(typing.get_type_hints(declared, include_extras=True)[part])
            if field.metadata and typing.get_origin(declared) is not Literal:
                declared = Annotated[(declared, *field.metadata)]
    return declared


def _non_optional(declared: Any) -> Any:
    arguments = [argument for argument in typing.get_args(declared) if argument is not type(None)]
    return arguments[0] if typing.get_origin(declared) is typing.Union else declared


def _list_type(declared: Any) -> Any:
    return typing.get_args(declared)[0] if typing.get_origin(declared) is Annotated else declared


def _name(path) -> str:
    """A file name as given, or its short repr when it is long or holds control characters."""
    text = str(path)
    return text if 0 < len(text) <= 120 and text.isprintable() else show(text)


def all_keys() -> list[str]:
    keys = []

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                keys.append(f"{prefix}{key}")
    walk(Config().to_dict(), "")
    return keys


def _did_you_mean_key(dotted: str) -> str:
    """Prefers a key of the same section that the typed leaf begins (lr -> lr_local), then
    the closest spelling, then the same leaf in another section (rounds -> train.rounds)."""
    if len(dotted) > 100:
        return ""
    keys = all_keys()
    section, _, leaf = dotted.rpartition(".")
    same_section = [k for k in keys if k.rpartition(".")[0] == section]
    close = [k for k in same_section if k.rpartition(".")[2].startswith(leaf)]
    close = close or difflib.get_close_matches(dotted, keys, n=1, cutoff=0.6)
    close = close or [k for k in keys if k.rpartition(".")[2] == leaf]
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---- YAML files and overrides ----

def _read_yaml(path: str | os.PathLike) -> dict:
    where = f"config file {_name(path)}"
    problem = path_problem(os.fspath(path))
    if problem:
        raise ConfigError(f"{where} {problem}")
    loaded = read_yaml(path, where)
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where} must hold a mapping of keys, not a {type(loaded).__name__}")
    return loaded


def _apply_override(raw: dict, text: str) -> None:
    dotted, separator, value = text.partition("=")
    dotted = dotted.strip()
    if not separator or not dotted:
        raise ConfigError(f"override {show(text)} must look like key=value, e.g. train.rounds=10")
    node = raw
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            raise ConfigError(f"unknown key {show(dotted)}{_did_you_mean_key(dotted)}")
    leaf = parts[-1]
    if leaf not in node and not (node is raw.get("algorithm") and len(parts) == 2) and not _free_mapping(parts[:-1]):
        raise ConfigError(f"unknown key {show(dotted)}{_did_you_mean_key(dotted)}")
    if isinstance(node.get(leaf), dict) and _is_section(parts):
        raise ConfigError(f"{dotted} is a section; set one of its keys, e.g. {dotted}.{next(iter(node[leaf]))}=...")
    # A key whose value the file gave as a mapping (where a scalar belongs) takes the override's value.
    node[leaf] = parse_yaml(value, f"the value of {dotted}", positions=False) if value.strip() else None


def _default_at(parts: list[str]):
    """The schema's default value at the dotted key `parts` (a section's is a mapping), or None."""
    node = Config().to_dict()
    for part in parts:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _free_mapping(parts: list[str]) -> bool:
    """Whether the dotted key `parts` names a mapping whose keys the schema leaves open (a section's
    `options`, which the chosen component declares), rather than a section."""
    return parts[-1:] == ["options"] and _default_at(parts) == {}


def _is_section(parts: list[str]) -> bool:
    """Whether the dotted key `parts` names a section of the schema (not a value a file set to a mapping)."""
    node = _default_at(parts)
    return isinstance(node, dict) and bool(node)


def _merge(target: dict, source: dict, prefix: str) -> None:
    for key, value in source.items():
        dotted = f"{prefix}{key}"
        if key not in target and prefix != "algorithm.":
            raise ConfigError(f"unknown key {show(dotted)}{_did_you_mean_key(dotted)}")
        if isinstance(target.get(key), dict) and _free_mapping(dotted.split(".")):
            target[key] = value
        elif isinstance(target.get(key), dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{dotted} must be a mapping of keys ({', '.join(target[key])})")
            _merge(target[key], value, prefix=f"{dotted}.")
        else:
            target[key] = value
