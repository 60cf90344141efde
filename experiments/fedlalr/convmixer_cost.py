"""What one round of the paper's CIFAR protocol costs on this machine's CPU, from its two parts: a ConvMixer-256/8
training step on a batch of 50 (a round has 50 clients x 5 epochs x 10 batches = 2,500) and the evaluation of
10,000 test images (once a round). `rayfed sweep FILE --plan` cannot calibrate the protocol here: its calibration
runs whole rounds. Prints the median of a few repetitions of each, at the given torch thread count:
    python experiments/fedlalr/convmixer_cost.py --threads 1
"""
import argparse
import statistics
import time

import torch

from rayfed.models.zoo import convmixer

STEPS_PER_ROUND = 50 * 5 * 10
TEST_IMAGES = 10_000

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--repeats", type=int, default=5)
args = parser.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)

model = convmixer((3, 32, 32), 10)
inputs, targets = torch.randn(50, 3, 32, 32), torch.randint(0, 10, (50,))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = []
for _ in range(args.repeats):
    started = time.perf_counter()
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()
    steps.append(time.perf_counter() - started)
model.eval()
chunk = torch.randn(500, 3, 32, 32)
evals = []
with torch.no_grad():
    for _ in range(max(2, args.repeats // 2)):
        started = time.perf_counter()
        model(chunk)
        evals.append((time.perf_counter() - started) * TEST_IMAGES / len(chunk))
step_s, eval_s = statistics.median(steps[1:]), statistics.median(evals)
print(f"torch {torch.__version__}, {args.threads} thread(s): training step (batch 50) median {step_s:.2f} s "
      f"(of {[round(s, 2) for s in steps]}); evaluation of {TEST_IMAGES} images median {eval_s:.0f} s")
print(f"one round of the protocol: {STEPS_PER_ROUND} steps + 1 evaluation = {STEPS_PER_ROUND * step_s + eval_s:.0f} s "
      f"= {(STEPS_PER_ROUND * step_s + eval_s) / 3600:.1f} h")
