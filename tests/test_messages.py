import pickle

import numpy as np
import torch

from rayfed.algorithms.base import Upload
from rayfed.engine.messages import Broadcast, ClientResult, WorkerResult, WorkerTiming


def test_a_broadcast_and_a_worker_result_travel_as_numpy_arrays_with_the_same_bits():
    generator = torch.Generator().manual_seed(0)
    down = Broadcast({"params": torch.randn(7, generator=generator),
                      "half": torch.randn(3, generator=generator).bfloat16()}, torch.arange(4.0))
    result = WorkerResult.pack([ClientResult(client, Upload({"model_change": torch.randn(5, generator=generator),
                                                             "count": torch.tensor([client])}, 10 + client,
                                                            {"train_loss": 0.5 + client}),
                                             torch.full((2,), float(client))) for client in (3, 8)])
    result.timing = WorkerTiming(0.1, 0.2, 0.3, 4.0)
    for message in (down, result):
        back = pickle.loads(pickle.dumps(message, protocol=5))
        assert type(back) is type(message)
        for name in message.tensors:
            assert back.tensors[name].dtype == message.tensors[name].dtype
            assert torch.equal(back.tensors[name], message.tensors[name])
        assert torch.equal(back.buffers, message.buffers)
    shipped_down, shipped_result = down.__reduce__()[1][1], result.__reduce__()[1][1]
    assert isinstance(shipped_down[0]["params"], np.ndarray) and isinstance(shipped_down[1], np.ndarray)
    assert isinstance(shipped_result[3]["model_change"], np.ndarray) and isinstance(shipped_result[4], np.ndarray)
    # bfloat16 has no numpy dtype: it keeps torch's pickling.
    assert isinstance(shipped_down[0]["half"], torch.Tensor)
    back = pickle.loads(pickle.dumps(result))
    assert (back.client_ids, back.num_samples, back.metrics, back.timing) == \
        (result.client_ids, result.num_samples, result.metrics, result.timing)


def test_an_array_read_only_in_the_object_store_arrives_as_a_writable_tensor_of_its_own():
    array = np.arange(6, dtype=np.float32)
    array.flags.writeable = False
    rebuild = Broadcast({}, torch.zeros(0)).__reduce__()[0]
    down = rebuild(Broadcast, ({"params": array}, np.zeros(0, np.float32)))
    down.tensors["params"].add_(1)
    assert array.tolist() == [0, 1, 2, 3, 4, 5]
    assert down.tensors["params"].tolist() == [1, 2, 3, 4, 5, 6]
