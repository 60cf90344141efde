"""A least-squares ClientTask: a local problem whose gradients can be written by hand."""
import torch


class LeastSquaresTask:
    """F_i(w; rows) = 1/2 mean_rows (a_r . w - b_r)^2 on the client's own (A, b)."""

    def __init__(self, client_id: int, dim: int = 5, num_samples: int = 12, batch_size: int = 4, steps: int = 3):
        generator = torch.Generator().manual_seed(1000 + client_id)
        self.A = torch.randn(num_samples, dim, generator=generator)
        self.b = torch.randn(num_samples, generator=generator) + client_id
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.params = torch.zeros(dim)
        self.position = 0
        self.steps = steps
        self.lr_factor = 1.0
        self.draws = torch.Generator().manual_seed(2000 + client_id)

    def start_from(self, params):
        self.params.copy_(params)
        return self.params

    def next_batch(self):
        rows = torch.arange(self.position, self.position + self.batch_size) % self.num_samples
        self.position += self.batch_size
        return self.A[rows], self.b[rows]

    def draw_batch(self, size=None):
        rows = torch.randperm(self.num_samples, generator=self.draws)[:size or self.batch_size]
        return self.A[rows], self.b[rows]

    def loss_and_grad(self, params, batch):
        A, b = batch
        residual = A @ params - b
        return (0.5 * residual.pow(2).mean()).detach(), A.T @ residual / len(b)

    def paired_loss_and_grad(self, current, previous, batch):
        loss, grad = self.loss_and_grad(current, batch)
        return loss, grad, self.loss_and_grad(previous, batch)[1]

    def full_loss_and_grad(self, params):
        return self.loss_and_grad(params, (self.A, self.b))

    def decay(self, params, lr):
        pass


DIM = 5
NUM_CLIENTS = 6
SCHEDULE = [[0, 3, 5], [1, 2, 3], [4, 0, 2], [5, 1, 4], [2, 3, 0], [1, 5, 4]]


def client(client_id, steps=3):
    """A fresh task for the client: its batch stream starts over."""
    return LeastSquaresTask(client_id, DIM, num_samples=8 + client_id, steps=steps)


def make(name, param_blocks=((0, 2), (2, DIM)), **hyper):
    """The registered algorithm `name` with lr_local 0.1, lr_global 0.7 unless given, defaults otherwise."""
    from rayfed.algorithms.base import AlgorithmContext, build_algorithm
    from rayfed.config import algorithm_section
    from rayfed.registry import ALGORITHMS
    default_global = 0.7 if ALGORITHMS.get(name).target.server_lr else 1.0
    config = algorithm_section({"name": name, "lr_local": hyper.pop("lr_local", 0.1),
                                 "lr_global": hyper.pop("lr_global", default_global), **hyper})
    return build_algorithm(config, AlgorithmContext(param_blocks=tuple(param_blocks)))


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


class ScriptedTask:
    """A float64 client whose k-th gradient of the round is `gradients[k]` wherever it is taken:
    the losses <g_k, x> of a deterministic 'stochastic' problem (specs/fedlalr.md §7)."""

    def __init__(self, gradients, num_samples=10):
        self.gradients = [torch.as_tensor(g, dtype=torch.float64) for g in gradients]
        self.steps = len(self.gradients)
        self.lr_factor = 1.0
        self.num_samples = num_samples
        self.position = 0
        self.params = torch.zeros_like(self.gradients[0])

    def start_from(self, params):
        self.params = params.clone()
        return self.params

    def next_batch(self):
        self.position += 1
        return self.position - 1

    def loss_and_grad(self, params, batch):
        return (self.gradients[batch] * params).sum().detach(), self.gradients[batch].clone()

    def decay(self, params, lr):
        pass


class QuadraticTask(ScriptedTask):
    """f_i(x) = 1/2 x'H_i x - b_i'x in float64, its k-th gradient H_i x - b_i + noise_k: a smooth
    heterogeneous problem whose gradients depend on where they are taken."""

    def __init__(self, client_id, dim=4, steps=3, scale=1.0, num_samples=None):
        generator = torch.Generator().manual_seed(500 + client_id)
        root = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        self.H = scale * (root @ root.T / dim + torch.eye(dim, dtype=torch.float64))
        self.b = scale * (torch.randn(dim, generator=generator, dtype=torch.float64) + client_id)
        noise = scale * 0.3 * torch.randn(steps, dim, generator=generator, dtype=torch.float64)
        super().__init__(list(noise), num_samples if num_samples is not None else 10 + client_id)

    def loss_and_grad(self, params, batch):
        loss = 0.5 * params @ self.H @ params - self.b @ params + self.gradients[batch] @ params
        return loss.detach(), self.H @ params - self.b + self.gradients[batch]
