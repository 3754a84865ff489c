#!/usr/bin/env python3
"""The GPU check for a session that has a CUDA machine (about 5 minutes): one script, one table.

1. Training step throughput of the WeKws-size DS-TCN (config/models/ds_tcn.yaml, hidden 256) at batch 256
   x 200 frames on pre-made batches: fp32, bf16 autocast, and torch.compile; GPU utilisation sampled with
   nvidia-smi meanwhile.
2. Whether the DataLoader keeps up: utterances/s of the training loader (8 workers) on a small synthetic
   corpus, against the best step throughput above.
3. A real `torchrun --nproc_per_node 1 scripts/train.py --gpus 0 --ddp.dist_backend nccl` epoch on that
   corpus, with its utterances/s from train_log.tsv. (NCCL refuses two ranks on one GPU; a 2-process run
   on one GPU would need gloo and is not what users run, so it is left out.)

Usage: python bench/gpu_check.py [--out bench/gpu_results.md] [--device cpu]  (cpu: a dry run of the code)
"""

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kws.config import load_model_config  # noqa: E402
from kws.datalist import read_dictionary  # noqa: E402
from kws.launch import torchrun_command  # noqa: E402
from kws.loss import max_pooling_loss  # noqa: E402
from kws.model import build_model  # noqa: E402


def sample_utilisation(stop, samples):
    while not stop.is_set():
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.split()
            samples.append(float(out[0]))
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return
        time.sleep(0.5)


def step_throughput(device, mode, steps=30, batch=256, frames=200):
    conf = load_model_config(REPO / "config/models/ds_tcn.yaml")
    model = build_model(conf["model"], 40, 2, None).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    forward = torch.compile(model) if mode == "compile" else model
    feats = torch.randn(batch, frames, 40, device=device)
    lengths = torch.full((batch,), frames, device=device)
    targets = torch.randint(-1, 2, (batch,), device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mode == "bf16"):
            logits, _ = forward(feats)
        loss, _ = max_pooling_loss(logits.float(), lengths, targets, 50)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()

    for _ in range(5):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    stop, samples = threading.Event(), []
    sampler = threading.Thread(target=sample_utilisation, args=(stop, samples), daemon=True)
    sampler.start()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    stop.set()
    utilisation = sum(samples) / len(samples) if samples else float("nan")
    return steps * batch / seconds, utilisation


def loader_throughput(corpus, workers, batches=40):
    """Steady-state utterances/s of the training data path on the GPU (store slices, fbank on the
    device), epochs back to back, timed from the first batch. `workers` is kept for the call sites:
    the data path runs in the training process."""
    import torch

    from kws.dataset import Featurizer, KwsDataset

    conf = load_model_config(REPO / "config/models/ds_tcn.yaml")
    dataset = KwsDataset(
        corpus / "train" / "data.list",
        conf["dataset_conf"],
        seed=666,
        rank=0,
        world_size=1,
        dictionary=read_dictionary(corpus / "dict" / "words.txt"),
    )
    featurize = Featurizer(conf["dataset_conf"], device="cuda" if torch.cuda.is_available() else "cpu", pin_memory=True)
    count, seen, start = 0, 0, None
    for epoch in range(1000):
        for batch in featurize.batches(dataset, epoch):
            if start is None:
                start = time.perf_counter()
            else:
                count += len(batch[0])
            seen += 1
            if seen > batches:
                return count / (time.perf_counter() - start)
    return float("nan")


def torchrun_epoch(corpus, workdir):
    model_dir = workdir / "model"
    command = [
        *torchrun_command(1, python=sys.executable),
        str(REPO / "scripts/train.py"),
        "--gpus",
        "0",
        "--ddp.dist_backend",
        "nccl",
        "--config",
        str(REPO / "config/models/ds_tcn.yaml"),
        "--max_epoch",
        "1",
        "--train_data",
        str(corpus / "train/data.list"),
        "--cv_data",
        str(corpus / "dev/data.list"),
        "--model_dir",
        str(model_dir),
        "--num_keywords",
        "2",
        "--min_duration",
        "50",
        "--num_workers",
        "8",
        "--pin_memory",
        "--dict",
        str(corpus / "dict" / "words.txt"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=400)
    if result.returncode != 0:
        return f"failed: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else result.returncode}"
    rows = (model_dir / "train_log.tsv").read_text().splitlines()
    header, last = rows[0].split("\t"), rows[-1].split("\t")
    return f"{float(last[header.index('utts_per_s')]):.0f} utt/s (epoch incl. CV)"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "bench" / "gpu_results.md"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-torchrun", action="store_true", help="skip the torchrun epoch (3.)")
    args = parser.parse_args()
    device = torch.device(args.device)
    lines = [
        f"# GPU check ({torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu dry run'})",
        "",
        f"torch {torch.__version__}, measured {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        "| what | figure |",
        "|---|---|",
    ]
    best = 0.0
    for mode in ("fp32", "bf16", "compile"):
        try:
            rate, utilisation = step_throughput(device, mode, steps=30 if device.type == "cuda" else 2)
            best = max(best, rate)
            lines.append(f"| DS-TCN 256 step, batch 256 x 200, {mode} | {rate:.0f} utt/s, GPU {utilisation:.0f}% |")
        except Exception as err:  # noqa: BLE001 - report and go on: this is a measurement script
            lines.append(f"| DS-TCN 256 step, {mode} | failed: {type(err).__name__}: {str(err)[:120]} |")
        print(lines[-1], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        corpus = workdir / "corpus"
        subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts/synthesize_corpus.py"),
                "--out-dir",
                str(corpus),
                "--size",
                "small",
                "--threads",
                "8",
            ],
            check=True,
            capture_output=True,
        )
        for split in ("train", "dev"):
            subprocess.run(
                [
                    sys.executable,
                    str(REPO / "scripts/make_list.py"),
                    "--data-dir",
                    str(corpus / split),
                    "--dict",
                    str(corpus / "dict/words.txt"),
                ],
                check=True,
                capture_output=True,
            )
        rate = loader_throughput(corpus, workers=8)
        lines.append(f"| loader, 8 workers | {rate:.0f} utt/s = {rate / max(best, 1e-9):.2f}x the best step |")
        print(lines[-1], flush=True)
        if device.type == "cuda" and not args.no_torchrun:
            lines.append(f"| torchrun 1 GPU, NCCL, 1 epoch (small corpus) | {torchrun_epoch(corpus, workdir)} |")
            print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
