"""The codec: compression.* on both ends of the wire, and the bits a deployment would send.

On a worker it replaces the algorithm's compressed upload with the message that carries it, drawn
from the client's own stream (seed, round, client); on the server it decodes the message back and
counts every round's bits up and down (a compressed message its operator's bits, 32 a float for
everything else). A model change y - x is encoded as the descent direction x - y that FedCOM's
clients send (Haddadpour et al., AISTATS 2021, Algorithm 1), so that a compressor that is not
symmetric under negation (the affine quantizers) sees what the paper quantizes."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

from rayfed.algorithms.base import Upload
from rayfed.compression import FLOAT_BITS, MESSAGE_SEPARATOR, build_compressor, decode_upload
from rayfed.seeding import Purpose, torch_generator

MODEL_CHANGE = "model_change"


@dataclass
class Downlink:
    """compression.downlink: the round's reply compressor, one draw on the server's stream (seed,
    round); `bits` is the message's, once it was used."""

    codec: "Codec"
    round: int
    bits: int | None = field(default=None)

    def __call__(self, vector: Tensor) -> Tensor:
        compressor = self.codec.compressor
        message = compressor.compress(vector, torch_generator(self.codec.seed, Purpose.COMPRESSION_DOWNLINK,
                                                              self.round))
        self.bits = message.bits
        return compressor.decompress(message, vector.numel())


class Codec:
    def __init__(self, compression, upload_name: str | None, blocks: list[tuple[int, int]], num_params: int,
                 seed: int):
        """`compression`: the config's compression section; `upload_name`: the algorithm's compressed
        upload (Algorithm.compressed_upload); `blocks`: the model's parameter tensors in the flat vector."""
        self.compressor = build_compressor(compression, blocks) if compression.name != "identity" else None
        self.compresses_reply = compression.downlink
        self.upload_name = upload_name
        self.num_params = num_params
        self.seed = seed
        # The sign the compressor sees: a model change goes as its descent direction.
        self.sign = -1.0 if upload_name == MODEL_CHANGE else 1.0
        self.bits_totals = [0, 0]

    def encode(self, upload: Upload, round: int, client_id: int) -> Tensor | None:
        """Replaces the upload's compressed tensor with its message, in place; records the message's
        bits and its relative error ||Q(v) - v||^2 / ||v||^2. Returns the tensor as the server will
        decode it (None when the algorithm names no compressed upload)."""
        if self.upload_name is None:
            return None
        if self.compressor is None:
            return upload.tensors.get(self.upload_name)
        vector = upload.tensors.pop(self.upload_name)
        # A CPU stream whatever the device: the same draws on a GPU worker as on a CPU one.
        message = self.compressor.compress(vector if self.sign > 0 else -vector,
                                           torch_generator(self.seed, Purpose.COMPRESSION, round, client_id))
        upload.tensors.update({f"{self.upload_name}{MESSAGE_SEPARATOR}{part}": value
                               for part, value in message.parts.items()})
        decoded = self.compressor.decompress(message, vector.numel())
        decoded = decoded if self.sign > 0 else -decoded
        norm = float(vector.double().pow(2).sum())
        upload.metrics["message_bits"] = message.bits
        upload.metrics["compression_error"] = float((decoded - vector).double().pow(2).sum()) / norm if norm else 0.0
        return decoded

    def decode(self, result):
        """`result` (a ClientResult) with its message decoded back into the upload the algorithm
        aggregates; its metrics keep the bytes the message took."""
        if self.compressor is None:
            return result
        tensors = decode_upload(result.upload.tensors, self.upload_name, self.compressor, self.num_params)
        if self.sign < 0:
            tensors[self.upload_name] = -tensors[self.upload_name]
        upload = Upload(tensors, result.upload.num_samples, {**result.upload.metrics, "bytes_sent": result.nbytes})
        return type(result)(result.client_id, upload, result.buffers)

    def downlink(self, round: int) -> Downlink | None:
        return Downlink(self, round) if self.compresses_reply else None

    def count(self, counted: list, down_bytes: int, num_sampled: int, sends_model: bool,
              reply: dict[str, Tensor] | None, replied: int, downlink: Downlink | None) -> dict:
        """The round's bits up (each counted upload: its message's bits, 32 a float for the rest) and
        down (32 a float of the broadcast, to every sampled client, and the reply to the `replied`
        clients), and their running totals."""
        up = 0
        for result in counted:
            upload = result.upload
            message_bits = upload.metrics.get("message_bits")
            if message_bits is None:
                up += FLOAT_BITS * result.floats
                continue
            floats = sum(t.numel() for name, t in upload.tensors.items() if name != self.upload_name)
            up += int(message_bits) + FLOAT_BITS * (floats + result.buffers.numel())
        down = 8 * down_bytes * num_sampled if sends_model else 0
        if reply is not None:
            per_client = (downlink.bits if downlink is not None and downlink.bits is not None
                          else FLOAT_BITS * sum(t.numel() for t in reply.values()))          # float32 replies
            down += per_client * replied
        self.bits_totals = [self.bits_totals[0] + up, self.bits_totals[1] + down]
        metrics = {"bits_up": up, "bits_down": down, "bits_up_total": self.bits_totals[0],
                   "bits_down_total": self.bits_totals[1]}
        errors = [r.upload.metrics["compression_error"] for r in counted if "compression_error" in r.upload.metrics]
        if errors:
            metrics["compression_error"] = float(np.mean(errors))
        return metrics


def sent_bytes(result) -> int:
    """The bytes a client's upload took on its way to the server: its message's, when it came compressed."""
    sent = result.upload.metrics.get("bytes_sent")
    return int(result.nbytes if sent is None else sent)

