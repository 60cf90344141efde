"""Bernoulli availability's draw for every client in a round: the definition as floats (each client's uniform
below its p_i) against BernoulliOnline.online (integer thresholds, hashed in blocks), in one process, medians of
21 rounds, checking that both give the same clients.

    python experiments/scaling/bernoulli_online.py
"""
import time

import numpy as np

from rayfed.systems.availability import BernoulliOnline, online_probabilities

for count in (10**5, 10**6, 10**7):
    model, probabilities = BernoulliOnline(count, 0, 0.5, 10.0), online_probabilities(count, 0, 0.5, 10.0)
    as_floats, in_blocks = [], []
    for round in range(21):
        started = time.perf_counter()
        expected = model.uniforms.at(round) < probabilities
        as_floats.append(time.perf_counter() - started)
        started = time.perf_counter()
        online = model.online(round, 0.0)
        in_blocks.append(time.perf_counter() - started)
        assert np.array_equal(online, expected), f"N={count}, round {round}: not the definition's clients"
    floats_s, blocks_s = np.median(as_floats), np.median(in_blocks)
    print(f"N={count:>9}: floats {floats_s * 1e3:7.2f} ms, integers in blocks {blocks_s * 1e3:7.2f} ms, "
          f"{floats_s / blocks_s:.2f}x; {blocks_s / count * 1e9:.2f} ns a client")
