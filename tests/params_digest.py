"""A callback a test names in `logging.callbacks` of a `rayfed run` command, to learn its final model's bits."""
import hashlib

import rayfed

DIGEST_FILE = "params.sha256"


class ParamsDigest(rayfed.Callback):
    """Writes the SHA-256 of the final global parameters' bytes into the run directory."""

    def on_run_end(self, run, summary):
        (run.run_dir / DIGEST_FILE).write_text(hashlib.sha256(run.global_params().numpy().tobytes()).hexdigest())
