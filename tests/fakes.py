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
