"""The preflight: every check that needs more than the schema, run once before any work, and what
`rayfed.load_config`, `rayfed.run`, `rayfed.resume` and `rayfed config` all go through.

Its order is what makes a component's declared defaults the run's, by construction:
1. the plugins named in the config are imported, so that the names they register are valid values;
2. the schema (rayfed.config) validates the keys given: the `algorithm:` section is validated by the
   Params of the algorithm it names from the keys the user wrote alone, never from another
   algorithm's values, so its defaults (common keys included) fill the rest;
3. the choices left to rayfed are resolved from the components' declarations ("auto" partition and
   model, a compressor's and a selector's defaults, the adaptive interval's, FedBuff's);
4. combinations of sections are checked against the chosen components' capabilities;
5. the world: the dataset's files, the model built, the availability walk, memory, the trackers.
Each problem is one line (ConfigError, exit code 2)."""
import functools
import math
import os
import re

import numpy as np
import torch

from rayfed.adversary import ATTACK_KEYS
from rayfed.aggregation import REQUIRED, RULE_KEYS, build_rule
from rayfed.aggregation.base import TooFewInputs
from rayfed.algorithms.local_training import LocalSchedule
from rayfed.algorithms.params import RunFacts
from rayfed.callbacks.registry import check_logging
from rayfed.config import (CACS_DEFAULTS, INTERVAL_DEFAULTS, Config, DataConfig, TrainConfig, path_problem, read_raw,
                           validate)
from rayfed.data import missing_files
from rayfed.data.base import sample_count
from rayfed.data.lazy import TRAIN_LOSS_MAX_CLIENTS, is_lazy
from rayfed.errors import ConfigError, show
from rayfed.faults import SERVER, parse_fault
from rayfed.fields import format_number
from rayfed.plugins import load_plugins
from rayfed.registry import AGGREGATION_RULES, ALGORITHMS, ATTACKS, COMPRESSORS, DATASETS, PARTITIONERS, SELECTORS
from rayfed.resources import check_availability_walk, check_memory, check_model, has_batchnorm

_LINE_BREAK = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def _one_line(function):
    """Errors are printed as one line: a value or a file name quoted in a message must not break it."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ConfigError as error:
            message = str(error)
            if _LINE_BREAK.search(message):
                raise ConfigError(_LINE_BREAK.sub(lambda match: ascii(match.group())[1:-1], message)) from None
            raise
    return wrapper


@_one_line
def load_config(path: str | os.PathLike | None = None, overrides: list[str] = ()) -> Config:
    """The quick-start defaults, then the YAML file at `path`, then `key=value` overrides;
    typed, resolved and checked (the preflight). Raises ConfigError on any bad input."""
    raw = read_raw(path, overrides)
    plugins = raw.get("plugins")
    if isinstance(plugins, list) and all(_loadable(plugin) for plugin in plugins):
        load_plugins(plugins)       # before validation: they register the names the config may use
    return resolve(validate(raw))


def _loadable(plugin) -> bool:
    """A plugin spec that can be imported before the schema has checked it (else the schema's line comes first)."""
    if isinstance(plugin, dict):
        return all(isinstance(value, str) and not path_problem(value) for value in plugin.values()) \
            and len({"path", "module"} & set(plugin)) == 1
    return isinstance(plugin, str) and not path_problem(plugin)


@_one_line
def resolve(config: Config) -> Config:
    """Validates `config` and fills in the choices left to rayfed ("auto", components' defaults),
    then checks it against the world. Returns a new Config; the one given is not changed."""
    plugins = load_plugins(config.plugins)
    config = validate({**config.to_dict(), "plugins": plugins})
    _check_combinations(config)
    _resolve_partition(config.data)
    if config.engine.backend == "local":
        # The local engine is one in-process worker; recording another count would mislead.
        config.engine.num_workers = 1
    if config.model.name == "auto":
        config.model.name = DATASETS.get(config.data.dataset).default_model
    config.algorithm.check(RunFacts(
        num_clients=config.data.num_clients, clients_per_round=config.train.clients_per_round,
        everyone_every_round=(config.train.clients_per_round == config.data.num_clients
                              and config.systems.availability == "always" and config.train.round_policy == "sync"),
        compressor=config.compression.name, combined_uploads=_combined_uploads(config)))
    _check_dataset_files(config)
    _check_work(config)
    model = check_model(config)
    check_availability_walk(config, model)
    check_memory(config, model)
    check_logging(config.logging)
    return config


# A run above this many sample gradients says so when it starts: hours on a laptop's CPU.
ANNOUNCED_WORK = 1e9


def estimated_work(config: Config) -> tuple[float, str]:
    """The run's sample gradients, about (from a client of the mean size), and how they add up in words."""
    train = config.train
    mean_size = max(1, sample_count(config.data.dataset, config.data) // config.data.num_clients)
    schedule = LocalSchedule.from_config(train)
    steps, batch = schedule.steps(train.rounds - 1, mean_size), min(train.batch_size, mean_size)
    work = float(train.rounds) * train.clients_per_round * steps * batch
    words = f"{train.rounds} rounds x {train.clients_per_round} clients x {steps} steps x {batch} samples"
    if config.selection.selector == "cacs":
        warmup = config.selection.cacs_warmup_rounds
        work += float(warmup) * config.data.num_clients * schedule.steps(0, mean_size) * batch
        words += f", and {warmup} warm-up rounds x {config.data.num_clients} clients"
    return work, words


def _check_work(config: Config) -> None:
    bound = config.train.max_sample_gradients
    work, words = estimated_work(config)
    if bound is not None and work > bound:
        raise ConfigError(f"this run computes about {format_number(float(f'{work:.2g}'))} sample gradients ({words}), "
                          f"over train.max_sample_gradients={format_number(bound)}; raise it (or set it to null) if "
                          f"you mean it")


def check_loaded_data(config: Config, dataset, partition) -> None:
    """What needs the loaded dataset and its split, before any client trains: samples of the shape the
    dataset declares (the model was checked against that shape), and no client that BatchNorm could
    only see one sample of."""
    declared = DATASETS.get(config.data.dataset).input_shape
    arrays = {"test": dataset.test_x} if is_lazy(dataset) else {"training": dataset.train_x, "test": dataset.test_x}
    for part, array in arrays.items():
        if tuple(array.shape[1:]) != tuple(declared):
            raise ConfigError(f"data.dataset={config.data.dataset} declares input_shape={tuple(declared)}, but its "
                              f"{part} samples have shape {tuple(array.shape[1:])}; fix its loader or its "
                              f"registration (rayfed.register_dataset)")
    if has_batchnorm(check_model(config)) and partition.num_clients > 1:
        one = np.flatnonzero(np.asarray(partition.sizes) == 1)
        if len(one):
            raise ConfigError(f"client {int(one[0])} holds one training sample ({len(one)} clients do), which "
                              f"model.name={config.model.name}'s BatchNorm cannot train on; use fewer clients "
                              f"(data.num_clients), another partition, or a model without BatchNorm "
                              f"(model.name=relu_mlp or logreg)")


def _check_combinations(config: Config) -> None:
    train, data, engine = config.train, config.data, config.engine
    if (train.target_accuracy is not None or train.target_loss is not None) and train.eval_every >= train.rounds:
        raise ConfigError(f"train.target_accuracy and train.target_loss stop the run at an evaluated round, but with "
                          f"train.eval_every={train.eval_every} and train.rounds={train.rounds} the only evaluation "
                          f"is after the last round; lower train.eval_every")
    deadline = train.deadline_s
    if train.round_policy == "deadline" and deadline is None:
        raise ConfigError("train.round_policy=deadline needs train.deadline_s > 0 (virtual seconds)")
    if deadline is not None and train.round_policy != "deadline":
        raise ConfigError(f"train.deadline_s is only used with train.round_policy=deadline, not {train.round_policy}")
    _resolve_async(config)
    _resolve_interval(train)
    _check_selection(config)
    _resolve_compression(config)
    _resolve_aggregation(config)
    _resolve_adversary(config)
    _resolve_privacy(config)
    if data.normalize != "channel" and not DATASETS.get(data.dataset).normalizable:
        normalizable = [entry.name for entry in DATASETS.entries() if entry.normalizable]
        raise ConfigError(f"data.normalize={data.normalize} applies to the torchvision image datasets "
                          f"({', '.join(normalizable)}), not data.dataset={data.dataset}")
    if (engine.round_timeout_s is not None or engine.fault_injection) and engine.backend != "ray":
        raise ConfigError("engine.round_timeout_s and engine.fault_injection need engine.backend=ray")
    actor_keys = [f"engine.{key}={value}" for key, value, default in (
        ("placement", engine.placement, "default"), ("worker_loss", engine.worker_loss, "continue"),
        ("server", engine.server, "actor"))
        if value != default]
    if actor_keys and engine.backend != "ray":
        verb = "needs" if len(actor_keys) == 1 else "need"
        raise ConfigError(f"{' and '.join(actor_keys)} {verb} engine.backend=ray: the local engine has no actors to "
                          f"place or lose")
    for entry in engine.fault_injection:
        if parse_fault(entry, engine.num_workers).target == SERVER and engine.server == "driver":
            raise ConfigError(f"engine.fault_injection entry {entry!r} kills the server, which engine.server=driver "
                              f"runs in the driver's own process; set engine.server=actor to test a server death")
    if train.similarity_clients > data.num_clients:
        raise ConfigError(f"train.similarity_clients={train.similarity_clients} exceeds data.num_clients="
                          f"{data.num_clients}: the diagnostic compares clients 0 .. n-1")
    if train.clients_per_round > data.num_clients:
        raise ConfigError(f"train.clients_per_round={train.clients_per_round} exceeds "
                          f"data.num_clients={data.num_clients}; it must be at most that")
    if engine.num_workers > data.num_clients:
        raise ConfigError(f"engine.num_workers={engine.num_workers} exceeds "
                          f"data.num_clients={data.num_clients}; a worker hosts at least one client")
    if engine.partial_sums:
        _check_partial_sums(config)
    if train.eval_train_loss and DATASETS.get(data.dataset).lazy and data.num_clients > TRAIN_LOSS_MAX_CLIENTS:
        raise ConfigError(f"train.eval_train_loss evaluates every client's training samples, which "
                          f"data.dataset={data.dataset} makes on demand; with data.num_clients={data.num_clients} "
                          f"(more than {TRAIN_LOSS_MAX_CLIENTS}) set train.eval_train_loss=false")


def _combined_uploads(config: Config) -> str | None:
    """The setting that hands the server step combined uploads (CombinedUploads), if any."""
    if config.engine.partial_sums:
        return "engine.partial_sums=true"
    if config.aggregation.rule != "mean":
        return f"aggregation.rule={config.aggregation.rule}"
    if config.privacy.mechanism != "none" and config.privacy.scope == "central":
        return f"privacy.mechanism={config.privacy.mechanism} (privacy.scope=central)"
    return None


def _check_partial_sums(config: Config) -> None:
    """engine.partial_sums: the server sees only the sum of each worker's uploads, so whatever needs
    them one by one is refused."""
    name = config.algorithm.name
    if not _algorithm_class(config).linear_uploads:
        raise ConfigError(f"engine.partial_sums does not apply to {name}, whose server step reads each client's "
                          f"upload (it applies to: {', '.join(_algorithms_that(lambda cls: cls.linear_uploads))})")
    if config.compression.name != "identity":
        raise ConfigError(f"engine.partial_sums needs compression.name=identity, not {config.compression.name}: "
                          f"compressed messages are decoded one by one on the server")
    if SELECTORS.get(config.selection.selector).weighted:
        raise ConfigError(f"engine.partial_sums needs selection.selector=uniform, not {config.selection.selector}: "
                          f"its per-client aggregation weights are not integers the workers can sum exactly")
    if config.train.round_policy == "async_buffered":
        raise ConfigError("engine.partial_sums does not apply with train.round_policy=async_buffered: the server "
                          "buffers each client's upload until it arrives")


def _check_selection(config: Config) -> None:
    """A selector other than uniform weights the round's clients itself (FedMoS, Sec. IV-A): the
    combinations where those weights are not defined are refused."""
    selection = config.selection
    selector, algorithm = selection.selector, config.algorithm.name
    for key, default in CACS_DEFAULTS.items():
        if selector != "cacs" and getattr(selection, key) is not None:
            raise ConfigError(f"selection.{key} only applies to selection.selector=cacs")
        if selector == "cacs" and getattr(selection, key) is None:
            setattr(selection, key, config.train.clients_per_round if key == "cacs_clusters" else default)
    if selector != "ucs" and selection.ucs_variant != "paper":
        raise ConfigError("selection.ucs_variant only applies to selection.selector=ucs")
    if not SELECTORS.get(selector).weighted:
        return
    if config.train.round_policy != "sync":
        raise ConfigError(f"selection.selector={selector} needs train.round_policy=sync: dropping or adding "
                          f"clients after the draw would leave its weights biased")
    if config.algorithm.agg_weighting != "uniform":
        raise ConfigError(f"algorithm.agg_weighting={config.algorithm.agg_weighting} does not apply with "
                          f"selection.selector={selector}, whose weights already follow the clients' sample counts")
    if (not SELECTORS.get(selector).unit_weight_sum and config.selection.ucs_variant == "paper"
            and _algorithm_class(config).averages_models):
        raise ConfigError(f"selection.selector=ucs (ucs_variant=paper) does not apply to {algorithm}: its weights "
                          f"sum to 1 only on average, and {algorithm} averages models, not updates")


def _component_keys(section, section_name: str, chosen: str, registry, keys: tuple[str, ...]) -> dict:
    """The keys the chosen component of `registry` declares, checked: any other key of `keys` set is
    refused naming the components that take it. Returns its declared defaults."""
    takes = registry.get(chosen).keys
    for key in keys:
        if key not in takes and getattr(section, key) is not None:
            users = [entry.name for entry in registry.entries() if key in entry.keys]
            raise ConfigError(f"{section_name}.{key} only applies to {registry.key}={' or '.join(users)}")
    own = {key: default for key, default in takes.items() if key not in keys}
    for key in getattr(section, "options", {}):
        if key not in own:
            raise ConfigError(f"{section_name}.options.{key} is not a key of {registry.key}={chosen} (its own keys: "
                              f"{', '.join(own) or 'none'})")
    return {key: default for key, default in takes.items() if key in keys}, own


def _fill_options(section, section_name: str, chosen: str, own: dict) -> None:
    """A plugin component's own keys in the section's `options`: the declared defaults where unset."""
    for key, default in own.items():
        if key not in section.options:
            if default is None or default == REQUIRED:
                raise ConfigError(f"{chosen} needs {section_name}.options.{key}")
            section.options[key] = default


def _resolve_aggregation(config: Config) -> None:
    """A rule other than mean replaces the weighted average the server step reads; what needs that
    average weighted, or each upload, or only their sums, is refused."""
    aggregation = config.aggregation
    rule = aggregation.rule
    shared, own = _component_keys(aggregation, "aggregation", rule, AGGREGATION_RULES, RULE_KEYS)
    for key, default in shared.items():
        if getattr(aggregation, key) is None and default == REQUIRED:
            raise ConfigError(f"aggregation.rule={rule} needs aggregation.{key}")
        if getattr(aggregation, key) is None:
            setattr(aggregation, key, default)
    _fill_options(aggregation, "aggregation", f"aggregation.rule={rule}", own)
    if build_rule(aggregation) is None:
        if aggregation.bucket_size != 1:
            raise ConfigError(f"aggregation.bucket_size={aggregation.bucket_size} needs a robust aggregation.rule: "
                              f"the mean of bucket means is the mean")
        return
    name = config.algorithm.name
    if not _algorithm_class(config).linear_uploads:
        raise ConfigError(f"aggregation.rule={rule} does not apply to {name}, whose server step reads each client's "
                          f"upload, not only their average (it applies to: "
                          f"{', '.join(_algorithms_that(lambda cls: cls.linear_uploads))})")
    refused = [(config.engine.partial_sums, "engine.partial_sums (the server would see only the sums)"),
               (config.algorithm.agg_weighting != "uniform",
                f"algorithm.agg_weighting={config.algorithm.agg_weighting} (the rule weighs every upload alike)"),
               (SELECTORS.get(config.selection.selector).weighted,
                f"selection.selector={config.selection.selector} (its per-client weights)"),
               (config.train.staleness_weight != "none",
                f"train.staleness_weight={config.train.staleness_weight} (per-client weights)")]
    for refuse, what in refused:
        if refuse:
            raise ConfigError(f"aggregation.rule={rule} does not apply with {what}")
    if config.train.round_policy == "sync":
        inputs = math.ceil(min(config.train.clients_per_round, config.data.num_clients) / aggregation.bucket_size)
        try:
            build_rule(aggregation)(torch.zeros(inputs, 1), None)
        except TooFewInputs as error:
            raise ConfigError(f"aggregation.rule={rule} needs at least {error.needed} inputs a round ({error.why}), "
                              f"but train.clients_per_round={config.train.clients_per_round} with "
                              f"aggregation.bucket_size={aggregation.bucket_size} gives it {inputs}") from None


def _resolve_adversary(config: Config) -> None:
    adversary = config.adversary
    attack = adversary.attack
    shared, own = _component_keys(adversary, "adversary", attack, ATTACKS, ATTACK_KEYS)
    for key, default in shared.items():
        if getattr(adversary, key) is None:
            setattr(adversary, key, default)
    _fill_options(adversary, "adversary", f"adversary.attack={attack}", own)
    if attack == "none":
        if adversary.fraction is not None or adversary.clients:
            raise ConfigError("adversary.fraction and adversary.clients need an adversary.attack other than none")
        return
    if (adversary.fraction is None) == (not adversary.clients):
        raise ConfigError(f"adversary.attack={attack} needs the adversaries: adversary.fraction or "
                          f"adversary.clients (one of the two)")
    num_clients = config.data.num_clients
    outside = [client for client in adversary.clients if client >= num_clients]
    if outside:
        raise ConfigError(f"adversary.clients names client {outside[0]}, but data.num_clients={num_clients} "
                          f"(ids 0 to {num_clients - 1})")
    refused = [(config.engine.partial_sums, "engine.partial_sums (the server would see only the sums)"),
               (config.compression.name != "identity",
                f"compression.name={config.compression.name} (an attack replaces the decoded upload, which a "
                f"compressed message would not carry)"),
               (_algorithm_class(config).replies,
                f"algorithm.name={config.algorithm.name} (its clients' state follows the upload they computed, not "
                f"the one the server got)")]
    for refuse, what in refused:
        if refuse:
            raise ConfigError(f"adversary.attack={attack} does not apply with {what}")


def _resolve_privacy(config: Config) -> None:
    """What differential privacy needs, checked, and z solved for when the section gives a target ε:
    every refusal names what would leak or what the accountant would not describe."""
    privacy, train = config.privacy, config.train
    mechanism = privacy.mechanism
    if mechanism == "none":
        changed = [key for key in ("clip_norm", "noise_multiplier", "target_epsilon", "delta", "clip_count_stddev")
                   if getattr(privacy, key) is not None]
        if changed or privacy.adaptive_clipping or privacy.per_layer or privacy.scope != "central":
            raise ConfigError(f"privacy.{(changed or ['adaptive_clipping'])[0]} needs a privacy.mechanism other than none")
        if train.target_epsilon is not None:
            raise ConfigError("train.target_epsilon needs a privacy.mechanism other than none")
        return
    for key in ("clip_norm", "delta"):
        if getattr(privacy, key) is None:
            raise ConfigError(f"privacy.mechanism={mechanism} needs privacy.{key}")
    name, selector = config.algorithm.name, config.selection.selector
    refused = [
        (privacy.scope == "central" and not _algorithm_class(config).linear_uploads,
         f"algorithm.name={name} and privacy.scope=central: its server step reads each client's upload, not only "
         f"the noised sum (central applies to: {', '.join(_algorithms_that(lambda cls: cls.linear_uploads))}; "
         f"privacy.scope=local noises each upload)"),
        (config.aggregation.rule != "mean",
         f"aggregation.rule={config.aggregation.rule}: the noise is calibrated to a sum's sensitivity, not the rule's"),
        (selector not in ("uniform", "poisson"),
         f"selection.selector={selector}: its draws or weights depend on the clients' data (sample counts, losses, "
         f"gradients); use uniform or poisson"),
        (config.algorithm.agg_weighting != "uniform",
         f"algorithm.agg_weighting={config.algorithm.agg_weighting}: a client's weight would scale its sensitivity"),
        (config.engine.partial_sums and privacy.scope == "central",
         "engine.partial_sums: the workers would sum the uploads before the server clips them"),
        (config.systems.availability != "always",
         f"systems.availability={config.systems.availability}: who is online changes each client's chance of "
         f"being sampled, which the accountant's event does not describe"),
        (train.round_policy == "async_buffered",
         "train.round_policy=async_buffered: uploads arrive across rounds, which no sampling event describes"),
        (train.round_policy == "overcommit" and selector == "poisson",
         "train.round_policy=overcommit with selection.selector=poisson: overcommit samples a count of clients"),
        (privacy.adaptive_clipping and privacy.scope == "local",
         "privacy.adaptive_clipping with privacy.scope=local: the clip norm is learnt from the server's noised count"),
        (privacy.adaptive_clipping and privacy.per_layer,
         "privacy.adaptive_clipping with privacy.per_layer: adaptive clipping learns one norm, of the whole upload"),
    ]
    for refuse, what in refused:
        if refuse:
            raise ConfigError(f"privacy.mechanism={mechanism} does not apply with {what}")
    from rayfed.privacy import count_stddev, event_of
    from rayfed.privacy.accountant import Accountant, calibrate, supported
    if not supported(privacy.accountant, event_of(config, 1.0)):
        other = "pld" if privacy.accountant == "rdp" else "rdp"
        hint = (f"; privacy.accountant={other} has one" if supported(other, event_of(config, 1.0)) else
                "; with selection.selector=poisson dp-accounting's pld accountant has one" if mechanism == "laplace"
                else "")
        raise ConfigError(f"privacy.accountant={privacy.accountant} has no account of privacy.mechanism={mechanism} "
                          f"with selection.selector={selector} (privacy.scope={privacy.scope}){hint}")
    if privacy.noise_multiplier is None and privacy.target_epsilon is None:
        raise ConfigError(f"privacy.mechanism={mechanism} needs privacy.noise_multiplier or privacy.target_epsilon")
    if privacy.target_epsilon is not None:
        try:
            solved = calibrate(privacy.accountant, lambda z: event_of(config, z), privacy.target_epsilon,
                               privacy.delta, train.rounds)
        except ValueError as error:
            raise ConfigError(f"privacy.target_epsilon={privacy.target_epsilon}: {error}") from None
        if privacy.noise_multiplier is not None and privacy.noise_multiplier != solved:
            raise ConfigError(f"privacy.noise_multiplier={privacy.noise_multiplier} and privacy.target_epsilon="
                              f"{privacy.target_epsilon} both set the noise (the target needs z = {solved:g}): set one")
        privacy.noise_multiplier = solved
    if privacy.adaptive_clipping and not privacy.noise_multiplier < 2 * count_stddev(config):
        raise ConfigError(f"privacy.adaptive_clipping pays for its count out of z, which must be below 2 sigma_b = "
                          f"{2 * count_stddev(config):g} (privacy.clip_count_stddev); z is {privacy.noise_multiplier:g}")
    if train.target_epsilon is not None:
        first = Accountant(privacy.accountant, event_of(config, privacy.noise_multiplier), privacy.delta).epsilon(1)
        if first > train.target_epsilon:
            raise ConfigError(f"train.target_epsilon={train.target_epsilon} is below the epsilon of one round "
                              f"({first:.4g} at delta={privacy.delta:g}): the run could not start")


def _resolve_compression(config: Config) -> None:
    """Fills the chosen compressor's defaults; a key of another operator is an error, as is a
    compressor for an algorithm whose upload it cannot carry."""
    compression = config.compression
    takes = _component_keys(compression, "compression", compression.name, COMPRESSORS,
                            ("levels", "kept", "ratio", "bits", "zero_point_noise"))[0]
    if compression.kept is not None and compression.ratio is not None:
        raise ConfigError("compression.kept and compression.ratio both give a sparsifier's k: set one")
    for key, default in takes.items():
        if getattr(compression, key) is None and not (key == "ratio" and compression.kept is not None):
            setattr(compression, key, default)
    if compression.per_tensor and compression.name == "identity":
        raise ConfigError("compression.per_tensor only applies with a compression.name other than identity")
    compressing = _algorithms_that(lambda algorithm: algorithm.compressed_upload and algorithm.takes_compression)
    if compression.downlink and (config.algorithm.name not in compressing or not _algorithm_class(config).replies
                                 or compression.name in ("identity", "top_k")):
        replying = ", ".join(name for name in compressing if ALGORITHMS.get(name).target.replies)
        raise ConfigError(f"compression.downlink compresses FedCOMGATE's reply, the average of the messages: it "
                          f"needs an algorithm whose server replies to compressed uploads (algorithm.name={replying}) "
                          f"and a dense compressor (a sum of top-k vectors is not sparse)")
    if compression.name != "identity" and config.algorithm.name not in compressing:
        raise ConfigError(f"compression.name={compression.name} does not apply to {config.algorithm.name}, whose "
                          f"uploads are not one model update (compression applies to: {', '.join(compressing)})")


def _algorithm_class(config: Config) -> type:
    return ALGORITHMS.get(config.algorithm.name).target


def _algorithms_that(has) -> list[str]:
    """The registered algorithms whose class has a capability (`has(cls)` is true)."""
    return [entry.name for entry in ALGORITHMS.entries() if has(entry.target)]


def _resolve_interval(train: TrainConfig) -> None:
    if train.interval == "fixed":
        for key in INTERVAL_DEFAULTS:
            if getattr(train, key) is not None:
                raise ConfigError(f"train.{key} is only used with train.interval=adaptive")
        return
    if train.local_epochs is not None:
        raise ConfigError("train.local_epochs does not apply with train.interval=adaptive, whose "
                          "interval_k_init + log_{interval_k_alpha}(t) counts the local work (in train.interval_unit)")
    for key, default in INTERVAL_DEFAULTS.items():
        if getattr(train, key) is None:
            setattr(train, key, default)


def _resolve_async(config: Config) -> None:
    train = config.train
    if train.round_policy != "async_buffered":
        for key in ("concurrency", "buffer_size"):
            if getattr(train, key) is not None:
                raise ConfigError(f"train.{key} is only used with train.round_policy=async_buffered")
        if train.staleness_weight != "none":
            raise ConfigError("train.staleness_weight is only used with train.round_policy=async_buffered")
        return
    if train.buffer_size is None:
        train.buffer_size = train.clients_per_round
    if train.concurrency is None:
        train.concurrency = train.buffer_size
    if not 1 <= train.buffer_size <= train.concurrency <= config.data.num_clients:
        raise ConfigError(f"train.round_policy=async_buffered needs 1 <= train.buffer_size ({train.buffer_size}) "
                          f"<= train.concurrency ({train.concurrency}) <= data.num_clients "
                          f"({config.data.num_clients})")
    algorithm = _algorithm_class(config)
    if algorithm.averages_models:
        raise ConfigError(f"train.round_policy=async_buffered does not apply to {config.algorithm.name}, whose "
                          f"clients upload models and moments: stale ones would pull the server's back")
    if not algorithm.runs_async:
        raise ConfigError(f"train.round_policy=async_buffered does not apply to {config.algorithm.name}: its clients "
                          f"need the server's step of the round they trained in, which a buffered server never forms")
    if train.staleness_weight != "none" and not algorithm.staleness_weighted:
        raise ConfigError(f"train.staleness_weight={train.staleness_weight} scales model updates; "
                          f"{config.algorithm.name} uploads something else (use it with "
                          f"{', '.join(_algorithms_that(lambda cls: cls.staleness_weighted))})")


def _resolve_partition(data: DataConfig) -> None:
    """data.partition=auto is the dataset's own clients where it has them, dirichlet otherwise; a
    partition the dataset or the partitioner's own check refuses is an error."""
    dataset = DATASETS.get(data.dataset)
    if data.partition == "auto":
        data.partition = "natural" if dataset.natural else "dirichlet"
    if data.partition == "natural" and not dataset.natural:
        natural = [entry.name for entry in DATASETS.entries() if entry.natural]
        raise ConfigError(f"data.partition=natural is only available for data.dataset={', '.join(natural[:-1])} or "
                          f"{natural[-1]}; use iid, dirichlet or shards")
    if dataset.partitions is not None and data.partition not in dataset.partitions:
        raise ConfigError(f"data.partition={data.partition} does not apply to data.dataset={data.dataset}, "
                          f"which takes data.partition={' or '.join(dataset.partitions)}")
    check = PARTITIONERS.get(data.partition).check
    if check is not None:
        check(data)


def _check_dataset_files(config: Config) -> None:
    if config.data.download or DATASETS.get(config.data.dataset).missing_files is None:
        return
    try:
        missing = missing_files(config.data.dataset, config.data.root)
    except OSError as error:
        raise ConfigError(f"data.root={show(config.data.root)} cannot be read ({error.strerror})") from None
    if missing:
        folder = missing[0].parent
        names = ", ".join(path.name for path in missing)
        raise ConfigError(f"{config.data.dataset} files missing under {folder}: {names} "
                          f"(put the official files there, or set data.download=true)")
