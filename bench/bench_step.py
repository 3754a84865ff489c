#!/usr/bin/env python3
"""The CPU model step alone, eager against torch.compile or bf16 autocast (issue 15, item 5): forward +
max-pooling loss + backward + clipping + Adam of the default model on random [batch, frames, 40] batches,
1 thread.

    python bench/bench_step.py --frames 224 320 416 --steps 30 --runs 3

Prints per mode and batch length: seconds to the first finished step (compilation included) and the
median step time after warm-up (CPU time of this process, less sensitive to other work than wall time).
Each mode runs in its own process, so that one's compiled kernels and caches do not help the other.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_mode(mode, frames_list, steps, batch, model_path):
    import torch

    from kws.config import load_model_config, set_model_dims
    from kws.loss import max_pooling_loss
    from kws.model import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = set_model_dims(load_model_config(model_path), 2)
    model = build_model(config["model"], 40, 2)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    forward = torch.compile(model, dynamic=True) if mode == "compile" else model
    rows = []
    for frames in frames_list:
        feats = torch.randn(batch, frames, 40)
        lengths = torch.full((batch,), frames)
        targets = torch.randint(-1, 2, (batch,))
        times = []
        start = time.process_time()
        first = None
        for _ in range(steps):
            t0 = time.process_time()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
                logits, _ = forward(feats)
            loss, _ = max_pooling_loss(logits.float(), lengths, targets, 50)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if first is None:
                first = time.process_time() - start
            times.append(time.process_time() - t0)
        rows.append({"mode": mode, "frames": frames, "first_s": first, "step_ms": 1000 * statistics.median(times[5:])})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, nargs="+", default=[224, 320, 416])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["eager", "compile"])
    parser.add_argument("--model", default=str(ROOT / "config" / "models" / "ds_tcn_small.yaml"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_mode(args.one, args.frames, args.steps, args.batch, args.model)))
        return
    results = {}
    for _ in range(args.runs):
        for mode in args.modes:  # alternating A B A B: drift on a shared machine hits both
            argv = [sys.executable, __file__, "--one", mode, "--steps", str(args.steps), "--batch", str(args.batch)]
            argv += ["--model", args.model, "--frames", *map(str, args.frames)]
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
            for row in json.loads(out.strip().splitlines()[-1]):
                results.setdefault((mode, row["frames"]), []).append(row)
    print("| mode | frames | first step s (compile included) | step ms, median of runs | utt/s per thread |")
    print("|---|---:|---:|---:|---:|")
    for (mode, frames), rows in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        step = statistics.median(r["step_ms"] for r in rows)
        first = statistics.median(r["first_s"] for r in rows)
        print(f"| {mode} | {frames} | {first:.1f} | {step:.1f} | {1000 * args.batch / step:.0f} |")


if __name__ == "__main__":
    main()
