"""A least-squares ClientTask: a local problem whose gradients can be written by hand."""
import torch


class LeastSquaresTask:
    """F_i(w; rows) = 1/2 mean_rows (a_r . w - b_r)^2 on the client's own (A, b)."""

    def __init__(self, client_id: int, dim: int = 5, num_samples: int = 12, batch_size: int = 4):
        generator = torch.Generator().manual_seed(1000 + client_id)
        self.A = torch.randn(num_samples, dim, generator=generator)
        self.b = torch.randn(num_samples, generator=generator) + client_id
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.params = torch.zeros(dim)
        self.position = 0

    def start_from(self, params):
        self.params.copy_(params)
        return self.params

    def next_batch(self):
        rows = torch.arange(self.position, self.position + self.batch_size) % self.num_samples
        self.position += self.batch_size
        return self.A[rows], self.b[rows]

    def loss_and_grad(self, params, batch):
        A, b = batch
        residual = A @ params - b
        return (0.5 * residual.pow(2).mean()).detach(), A.T @ residual / len(b)


DIM = 5
NUM_CLIENTS = 6
SCHEDULE = [[0, 3, 5], [1, 2, 3], [4, 0, 2], [5, 1, 4], [2, 3, 0], [1, 5, 4]]


def client(client_id):
    """A fresh task for the client: its batch stream starts over."""
    return LeastSquaresTask(client_id, DIM, num_samples=8 + client_id)


def make(name, local_steps=3, param_blocks=((0, 2), (2, DIM)), **hyper):
    """The registered algorithm `name` with lr_local 0.1, lr_global 0.7 unless given, defaults otherwise."""
    from rayfed.algorithms.registry import build_algorithm, resolve_hyperparameters
    from rayfed.config import AlgorithmConfig
    config = AlgorithmConfig(name=name, lr_local=hyper.pop("lr_local", 0.1), lr_global=hyper.pop("lr_global", 0.7),
                             **hyper)
    resolve_hyperparameters(config)
    return build_algorithm(config, local_steps=local_steps, param_blocks=list(param_blocks))


class Run:
    """What `run_rounds` saw: server states, client models, round metrics and final client states."""

    def __init__(self):
        self.states, self.client_models, self.metrics, self.client_states = [], [], [], {}


def run_rounds(algorithm, schedule=SCHEDULE, x0=None, task_factory=client):
    """Runs `algorithm` on the fake clients, keeping each client's state between its rounds;
    `schedule` lists each round's sampled ids in sampling order."""
    from rayfed.algorithms.base import RoundInfo
    run = Run()
    state = algorithm.server_init(torch.zeros(DIM) if x0 is None else x0, NUM_CLIENTS)
    for round, sampled in enumerate(schedule):
        down = algorithm.broadcast(state)
        uploads, models = {}, {}
        for client_id in sorted(sampled):
            task = task_factory(client_id)
            stored = run.client_states.get(client_id)
            upload, new_state = algorithm.client_train(
                task, down, stored if stored is not None else algorithm.client_init(client_id))
            if new_state is not None:
                run.client_states[client_id] = new_state
            uploads[client_id] = upload
            models[client_id] = task.params.clone()
        state, metrics = algorithm.server_step(state, uploads, RoundInfo(round, tuple(sampled), NUM_CLIENTS))
        run.states.append(state)
        run.client_models.append(models)
        run.metrics.append(metrics)
    return run
