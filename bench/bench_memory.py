#!/usr/bin/env python3
"""Resident memory of CPU training steps when every batch has a new length, against lengths padded
to multiples of kws.dataset.PAD_MULTIPLE (what the training batches do).

    python bench/bench_memory.py [--steps 800]

Each mode runs in a fresh process: the default model (config/models/ds_tcn_small.yaml), batch 16,
random lengths of 100-700 frames, 1 thread; prints RSS every 200 steps and the seconds taken.
"""

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mb():
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


def run(steps, multiple):
    import torch

    from kws.config import load_model_config
    from kws.dataset import padded_length
    from kws.loss import max_pooling_loss
    from kws.model import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(load_model_config(ROOT / "config" / "models" / "ds_tcn_small.yaml")["model"], 40, 2)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    rng = random.Random(0)
    started, trace = time.perf_counter(), []
    for step in range(steps):
        longest = rng.randint(100, 700)
        frames = padded_length(longest) if multiple else longest
        feats = torch.randn(16, frames, 40)
        logits, _ = model(feats)
        loss, _ = max_pooling_loss(logits, torch.full((16,), longest), torch.randint(-1, 2, (16,)), 50)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 200 == 0 or step == steps - 1:
            trace.append(f"{rss_mb():.0f}")
    return trace, time.perf_counter() - started


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--mode", choices=("exact", "padded"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        trace, seconds = run(args.steps, args.mode == "padded")
        print(f"{args.mode}: RSS MB every 200 steps {' '.join(trace)}; {seconds:.1f} s")
        return 0
    for mode in ("exact", "padded"):
        subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--mode", mode], check=True, cwd=ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
