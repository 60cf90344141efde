"""What an engine raises when an actor that owed it something is gone."""


class WorkerLost(Exception):
    """Workers whose process died, or that Ray restarted without their shard, while asked for something."""

    def __init__(self, workers: list[int]):
        super().__init__(workers)
        self.workers = workers


class ServerLost(Exception):
    """The server actor's process died."""
