#!/usr/bin/env python3
"""Training throughput before and after a change, in one run: one epoch of scripts/train.py under torchrun
(2 gloo processes x 1 thread, the default model, batch 16) on the same utterances, the code at `--ref`
(checked out into a temporary git worktree) and the working tree alternating A B A B ..., medians.

    python bench/bench_datapath.py --ref ea15b49 --utterances 2400 --runs 3

Reads the default run's corpus (results/data/synthetic, from `snakemake`); prints a table row per side
with train utt/s (train_log.tsv's utts_per_s: training utterances over the epoch's seconds, CV
included), the CPU seconds of the whole run (every process, start-up included: less sensitive than wall
time to other work on the machine) and the peak resident memory of the process tree, sampled.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from kws.launch import torchrun_command

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "results" / "data" / "synthetic"
CMVN = ROOT / "results" / "cmvn" / "fbank40_25ms_10ms_dither1" / "global_cmvn"  # the default model's


def subset(src, dst, count, int_labels=False):
    """Every n-th line of a data.list, `count` of them; `int_labels`: txt as the keyword id, the list
    format of kwsflow before 2026-12-01 (older revisions read nothing else)."""
    lines = Path(src).read_text().splitlines()[:: max(1, len(Path(src).read_text().splitlines()) // count)][:count]
    ids = dict(line.split() for line in (DATA / "dict" / "words.txt").read_text().splitlines() if line.strip())
    items = [json.loads(line) for line in lines]
    for item in items:  # each side runs in its own checkout: wav paths made absolute
        item["wav"] = str(ROOT / item["wav"])
        item.pop("phones", None)  # the keyword loss alone, like for like with WeKws (no phone_ctc head)
        if int_labels:
            item["txt"] = int(ids[item["txt"]])
    lines = [json.dumps(item) for item in items]
    Path(dst).write_text("".join(line + "\n" for line in lines))
    return dst


def peak_rss(proc, stop, out):
    peak = 0
    while not stop.is_set():
        try:
            tree = [proc, *proc.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.2)
    out.append(peak)


def shared_train_args(train_list, cv_list, model_dir, cmvn):
    """The train.py arguments kwsflow and WeKws share (the hi_xiaowen recipe's), for one epoch of each."""
    return [
        *("--train_data", str(train_list), "--cv_data", str(cv_list), "--model_dir", str(model_dir)),
        *("--num_keywords", "2", "--min_duration", "50", "--seed", "666", "--cmvn_file", str(cmvn), "--norm_var"),
    ]


def epoch(code, train_list, cv_list, model_dir, extra, dictionary=True):
    if model_dir.exists():
        shutil.rmtree(model_dir)
    command = [
        *torchrun_command(2, python=sys.executable),
        str(code / "scripts" / "train.py"),
        "--config",
        str(ROOT / "config/models/ds_tcn_small.yaml"),
        *shared_train_args(train_list, cv_list, model_dir, CMVN),
        "--max_epoch",
        "1",
        "--threads",
        "2",
        "--gpus",
        "-1",
        *(["--dict", str(DATA / "dict" / "words.txt")] if dictionary else []),
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(code), OMP_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = psutil.Popen(command, env=env, cwd=code, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop, peak = threading.Event(), []
    watcher = threading.Thread(target=peak_rss, args=(proc, stop, peak))
    watcher.start()
    output = proc.communicate()[0]
    stop.set()
    watcher.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{code}: training failed\n{output[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)  # the whole tree, start-up too
    header, row = [line.split("\t") for line in (model_dir / "train_log.tsv").read_text().splitlines()[:2]]
    row = dict(zip(header, row))
    print(f"{code.name}: train_loss {row['train_loss']} cv_loss {row['cv_loss']}", file=sys.stderr)
    return float(row["utts_per_s"]), peak[0] / 2**30, cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", default="ea15b49", help="git revision to compare against")
    p.add_argument("--ref-args", default="--num_workers 1", help="extra train.py arguments for the --ref side")
    p.add_argument("--now-args", default="", help="extra train.py arguments for the working tree's side")
    p.add_argument("--utterances", type=int, default=2400)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    if not (DATA / "train" / "data.list").is_file() or not CMVN.is_file():
        sys.exit(f"error: {DATA} or {CMVN} missing: run `snakemake --cores 2` (or its CMVN target) first")
    tmp = Path(tempfile.mkdtemp(prefix="bench_datapath."))
    ref = tmp / "ref"
    try:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(ref), args.ref], check=True, capture_output=True
        )
        lists = {
            side: [
                subset(DATA / split / "data.list", tmp / f"{side}.{split}.list", size, side == "ref")
                for split, size in (("train", args.utterances), ("dev", max(1, args.utterances // 8)))
            ]
            for side in ("ref", "now")
        }
        results = {"ref": [], "now": []}
        for _ in range(args.runs):
            results["ref"].append(epoch(ref, *lists["ref"], tmp / "model_ref", args.ref_args.split(), False))
            results["now"].append(epoch(ROOT, *lists["now"], tmp / "model_now", args.now_args.split()))
        summary = {
            side: {
                "utt_per_s": statistics.median(r[0] for r in runs),
                "runs": [r[0] for r in runs],
                "peak_gib": max(r[1] for r in runs),
                "cpu_s": statistics.median(r[2] for r in runs),
            }
            for side, runs in results.items()
        }
        ratio = summary["now"]["utt_per_s"] / summary["ref"]["utt_per_s"]
        print(f"| side | train utt/s (median of {args.runs}) | runs | CPU s of the whole run | peak RSS of the tree |")
        print("|---|---|---|---|---|")
        for side, label in (("ref", f"{args.ref} {args.ref_args}"), ("now", f"working tree {args.now_args}")):
            s = summary[side]
            print(
                f"| {label} | {s['utt_per_s']:.0f} | {', '.join(f'{x:.0f}' for x in s['runs'])} | "
                f"{s['cpu_s']:.0f} | {s['peak_gib']:.2f} GiB |"
            )
        print(f"ratio now / ref: {ratio:.2f}x ({args.utterances} utterances, 2 processes x 1 thread)")
        print(json.dumps(summary))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
