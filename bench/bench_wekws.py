#!/usr/bin/env python3
"""Training throughput of WeKws and kwsflow side by side, in one run: one epoch of each on the same
utterances with the same model (the default, config/models/ds_tcn_small.yaml), alternating WeKws kwsflow
WeKws kwsflow ..., 2 gloo processes x 1 thread (OMP_NUM_THREADS=1) under torchrun, medians.

    bash bench/setup_wekws.sh                  # once: WeKws 1a8ee65 + wenet 1a94771d into /work/wekws
    python bench/bench_wekws.py --utterances 2400 --runs 3

The WeKws checkout, its wenet and its extra packages live outside this repository; bench/setup_wekws.sh
makes them (and patches them for the CPU and torchaudio 2.11: see that script), and `--wekws`,
`--wenet`, `--site` point at them (defaults: its default target, /work/wekws/{wekws,wenet,site}).
Reads the default run's corpus (`--data`, results/data/synthetic, from `snakemake`) and CMVN; writes
only to a temporary folder.

Both sides train on one subset: every n-th utterance of train/data.list (`--utterances`), and as many
dev utterances divided by 8. kwsflow reads it as bench/bench_datapath.py writes it and runs exactly as
its `epoch()` does. WeKws gets the same lines as its hi_xiaowen recipe writes them (tools/make_list.py:
key, txt, duration, wav; txt the keyword token, <FILLER> for a negative, which wenet's tokenizer maps
through dict/dict.txt to -1) and a dict folder as its run.sh makes it (dict.txt with ids, words.txt the
tokens alone). Its config is kwsflow's `--config` with what WeKws has no equivalent of left out (printed,
e.g. dataset_conf.crop_negatives: WeKws trains on whole negatives, kwsflow on a 4 s window of each; for
a like-for-like epoch give `--config` a copy without it), and its recipe's arguments, except
--num_workers 1 (one DataLoader worker per process: train.py's default is 0, run.sh passes 8 for 8
cores; 1 as in the earlier side-by-side figures), --prefetch 100 (train.py's default), no --pin_memory,
the same --cmvn_file with --norm_var, --seed 666, --gpus=-1,-1 (one entry per process: train.py indexes
it by rank), --ddp.dist_backend gloo, --min_duration 50.

Throughput: training utterances / epoch seconds, the epoch being training and cross-validation, on each
side. kwsflow: train_log.tsv's utts_per_s (its timer runs from the epoch's start to after CV). WeKws
logs a timestamp (milliseconds) on every line of each rank: its epoch runs from the first
"Epoch 0 TRAIN info" line to the last "Epoch 0 CV info" line, of either rank; its utterances are the
subset's within dataset_conf.filter_conf (none are dropped by the default's limits). Start-up is the
whole torchrun command's wall time less that epoch. CPU s: every process of the command, start-up
included (less sensitive than wall time to other work on the machine); peak RSS: the process tree,
sampled. Each WeKws run is checked to have trained: a loss logged, CV done, its checkpoint 0.pt written.
"""

import argparse
import copy
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import bench_datapath
import psutil
import torch
import yaml

from kws.launch import torchrun_command

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TARGET = Path("/work/wekws")
CONFIG = ROOT / "config" / "models" / "ds_tcn_small.yaml"
PROCESSES = 2
# The keys of a WeKws 1a8ee65 config that its train.py, wenet's Dataset (1a94771d) and WeKws's model read.
WEKWS_DATASET_KEYS = {
    "filter_conf",
    "resample_conf",
    "speed_perturb",
    "feats_type",
    "fbank_conf",
    "mfcc_conf",
    "spec_aug",
    "spec_aug_conf",
    "spec_sub",
    "spec_sub_conf",
    "spec_trim",
    "spec_trim_conf",
    "shuffle",
    "shuffle_conf",
    "sort",
    "sort_conf",
    "batch_conf",
    "context_expansion",
    "context_expansion_conf",
    "frame_skip",
}
WEKWS_TRAINING_KEYS = {"grad_clip", "max_epoch", "log_interval", "criterion"}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ (.*)$")


def wekws_config(config, dst):
    """WeKws's config for the model and data settings of kwsflow's `config`: (path, what was left out)."""
    conf = yaml.safe_load(Path(config).read_text())
    dropped = []
    dataset = {}
    for key, value in conf["dataset_conf"].items():
        if key in WEKWS_DATASET_KEYS:
            dataset[key] = copy.deepcopy(value)
        else:
            dropped.append(f"dataset_conf.{key}: {json.dumps(value)}")
    if dataset.get("speed_perturb"):
        sys.exit(f"error: {config}: speed_perturb needs sox effects, which torchaudio 2.11 no longer has")
    # As WeKws's hi_xiaowen ds_tcn.yaml says them (the values kwsflow has as defaults).
    dataset = {"resample_conf": {"resample_rate": 16000}, "speed_perturb": False, "feats_type": "fbank", **dataset}
    training = {}
    for key, value in conf["training_config"].items():
        if key in WEKWS_TRAINING_KEYS:
            training[key] = value
        else:
            dropped.append(f"training_config.{key}: {json.dumps(value)}")
    training["max_epoch"] = 1
    if training.get("criterion", "max_pooling") != "max_pooling":
        sys.exit(f"error: {config}: training_config.criterion {training['criterion']!r}: this bench runs max_pooling")
    out = {
        "dataset_conf": dataset,
        "model": copy.deepcopy(conf["model"]),
        "optim": conf.get("optim", "adam"),
        "optim_conf": copy.deepcopy(conf["optim_conf"]),
        "training_config": training,
    }
    if out["optim"] != "adam":
        sys.exit(f"error: {config}: optim {out['optim']!r}: WeKws's train.py always uses Adam")
    Path(dst).write_text(yaml.safe_dump(out, sort_keys=False))
    return Path(dst), dropped


def wekws_lists(kwsflow_list, dst):
    """The lines of a kwsflow subset (bench_datapath.subset) as WeKws's tools/make_list.py writes them."""
    items = [json.loads(line) for line in Path(kwsflow_list).read_text().splitlines()]
    keep = ("key", "txt", "duration", "wav")
    Path(dst).write_text("".join(json.dumps({k: item[k] for k in keep}, ensure_ascii=False) + "\n" for item in items))
    return Path(dst), items


def wekws_dict(words, dst):
    """WeKws's dict folder as its run.sh makes it: dict.txt (token id, -1 the filler), words.txt (tokens)."""
    dst.mkdir(parents=True, exist_ok=True)
    lines = [line.split() for line in Path(words).read_text().splitlines() if line.strip()]
    (dst / "dict.txt").write_text("".join(f"{token} {index}\n" for token, index in lines))
    (dst / "words.txt").write_text("".join(f"{token}\n" for token, _ in lines))
    return dst


def stamp(line):
    match = STAMP.match(line)
    return (datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f"), match[2]) if match else (None, line)


def parse_wekws_log(output):
    """Epoch seconds (first TRAIN info line to last CV info line), logged train losses, cv loss, params."""
    starts, ends, losses, cv_losses, params = [], [], [], [], None
    for line in output.splitlines():
        when, text = stamp(line)
        if (found := re.search(r"the number of model params: (\d+)", line)) is not None:
            params = int(found[1])
        if when is None:
            continue
        if text.startswith("Epoch 0 TRAIN info"):
            starts.append(when)
        elif (found := re.match(r"TRAIN Batch 0/\d+ loss (\S+)", text)) is not None:
            losses.append(float(found[1]))
        elif (found := re.match(r"Epoch 0 CV info cv_loss (\S+)", text)) is not None:
            ends.append(when)
            cv_losses.append(float(found[1]))
    if not starts or not ends or not losses:
        raise RuntimeError(f"WeKws: no epoch start, CV line or training loss in its log\n{output[-3000:]}")
    return (max(ends) - min(starts)).total_seconds(), losses, statistics.mean(cv_losses), params


def kill_tree(proc):
    for child in proc.children(recursive=True):
        child.kill()
    proc.kill()


def wekws_epoch(args, config, train_list, cv_list, dict_dir, model_dir, utterances):
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    command = [
        *torchrun_command(PROCESSES, python=sys.executable),
        str(args.wekws / "wekws" / "bin" / "train.py"),
        "--gpus=" + ",".join(["-1"] * PROCESSES),  # "-1,-1" alone would read as an option
        "--ddp.dist_backend",
        "gloo",
        "--config",
        str(config),
        *bench_datapath.shared_train_args(train_list, cv_list, model_dir, args.cmvn),
        "--tensorboard_dir",
        str(model_dir / "tensorboard"),
        "--num_workers",
        "1",
        "--prefetch",
        "100",
        "--dict",
        str(dict_dir),
    ]
    path = [str(p) for p in (args.site, args.wekws, args.wenet) if p is not None]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1", PYTHONIOENCODING="UTF-8")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = psutil.Popen(command, env=env, cwd=model_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop, peak = threading.Event(), []
    watcher = threading.Thread(target=bench_datapath.peak_rss, args=(proc, stop, peak))
    watcher.start()
    try:
        output = proc.communicate(timeout=args.timeout)[0]
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        output = proc.communicate()[0]
        raise RuntimeError(
            f"WeKws: no end after {args.timeout} s (a rank with fewer batches waits forever)\n{output[-3000:]}"
        ) from None
    finally:
        stop.set()
        watcher.join()
    wall = time.monotonic() - started
    (model_dir / "train.log").write_text(output)
    if proc.returncode != 0:
        raise RuntimeError(f"WeKws: training failed\n{output[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if "Failed to read" in output:
        raise RuntimeError(f"WeKws could not read some audio\n{output[-3000:]}")
    seconds, losses, cv_loss, params = parse_wekws_log(output)
    checkpoint = model_dir / "0.pt"
    if not checkpoint.is_file() or not all(math.isfinite(x) for x in [*losses, cv_loss]):
        raise RuntimeError(f"WeKws: no checkpoint {checkpoint} or a loss not finite ({losses}, cv {cv_loss})")
    weights = torch.load(checkpoint, map_location="cpu", weights_only=True)
    print(
        f"wekws: train loss (logged batches) {' '.join(f'{x:.4f}' for x in losses)} cv_loss {cv_loss:.4f}; "
        f"{checkpoint.name} {sum(t.numel() for t in weights.values())} values",
        file=sys.stderr,
    )
    return {
        "utt_per_s": utterances / seconds,
        "epoch_s": seconds,
        "startup_s": wall - seconds,
        "cpu_s": cpu,
        "peak_gib": peak[0] / 2**30,
        "parameters": params,
        "train_utterances": utterances,
        "cv_loss": cv_loss,
    }


def kwsflow_epoch(train_list, cv_list, model_dir, extra):
    started = time.monotonic()
    utt_per_s, peak, cpu = bench_datapath.epoch(ROOT, train_list, cv_list, model_dir, extra)
    wall = time.monotonic() - started
    header, row = [line.split("\t") for line in (model_dir / "train_log.tsv").read_text().splitlines()[:2]]
    row = dict(zip(header, row))
    info = yaml.safe_load((model_dir / "run_info.yaml").read_text())
    return {
        "utt_per_s": utt_per_s,
        "epoch_s": float(row["seconds"]),
        "startup_s": wall - float(row["seconds"]),
        "cpu_s": cpu,
        "peak_gib": peak,
        "parameters": info["parameters"],
        "train_utterances": info["train_utterances"],
        "cv_loss": float(row["cv_loss"]),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wekws", type=Path, default=DEFAULT_TARGET / "wekws", help="the WeKws checkout")
    p.add_argument("--wenet", type=Path, default=DEFAULT_TARGET / "wenet", help="wenet checkout root (has wenet/)")
    p.add_argument("--site", type=Path, default=None, help="extra packages (default WEKWS/../site if there)")
    p.add_argument("--utterances", type=int, default=2400, help="training utterances (dev: a eighth of them)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--data", type=Path, default=bench_datapath.DATA, help="corpus with train/, dev/, dict/")
    p.add_argument("--cmvn", type=Path, default=bench_datapath.CMVN, help="global_cmvn of both sides")
    p.add_argument("--config", type=Path, default=CONFIG, help="kwsflow's model config (WeKws's is made from it)")
    p.add_argument("--kwsflow-args", default="", help="extra scripts/train.py arguments for kwsflow's side")
    p.add_argument("--timeout", type=int, default=1800, help="seconds one WeKws epoch may take")
    args = p.parse_args()
    args.wekws, args.wenet = args.wekws.resolve(), args.wenet.resolve()
    if args.site is None and (args.wekws.parent / "site").is_dir():
        args.site = args.wekws.parent / "site"
    for path, what in ((args.wekws / "wekws" / "bin" / "train.py", "--wekws"), (args.wenet / "wenet", "--wenet")):
        if not path.exists():
            sys.exit(f"error: {path} missing ({what}): run bench/setup_wekws.sh first")
    if not (args.data / "train" / "data.list").is_file() or not args.cmvn.is_file():
        sys.exit(f"error: {args.data} or {args.cmvn} missing: run `snakemake --cores 2` (or its CMVN target) first")
    # bench_datapath's subset() and epoch() read the corpus's dict and the CMVN from these.
    bench_datapath.DATA, bench_datapath.CMVN = args.data, args.cmvn
    kwsflow_extra = args.kwsflow_args.split()
    if args.config.resolve() != CONFIG:
        kwsflow_extra += ["--config", str(args.config.resolve())]  # epoch() passes CONFIG; the last one counts

    tmp = Path(tempfile.mkdtemp(prefix="bench_wekws."))
    try:
        config, dropped = wekws_config(args.config, tmp / "wekws.yaml")
        conf = yaml.safe_load(config.read_text())
        lists = {}
        for split, size in (("train", args.utterances), ("dev", max(1, args.utterances // 8))):
            theirs = bench_datapath.subset(args.data / split / "data.list", tmp / f"kwsflow.{split}.list", size)
            lists[split] = (theirs, *wekws_lists(theirs, tmp / f"wekws.{split}.list"))
        limits = conf["dataset_conf"].get("filter_conf", {})
        utterances = sum(
            limits.get("min_length", 10) <= item["duration"] * 100 <= limits.get("max_length", 10240)
            for item in lists["train"][2]
        )
        per_rank = [len(lists["train"][2][rank::PROCESSES]) for rank in range(PROCESSES)]
        batch = conf["dataset_conf"]["batch_conf"]["batch_size"]
        if len({math.ceil(n / batch) for n in per_rank}) > 1:
            sys.exit(f"error: {per_rank} utterances per process make unequal batch counts: WeKws's DDP would hang")
        dict_dir = wekws_dict(args.data / "dict" / "words.txt", tmp / "dict")
        if dropped:
            print(f"kwsflow-only settings of {args.config.name}, not given to WeKws: {'; '.join(dropped)}")

        results = {"wekws": [], "kwsflow": []}
        for _ in range(args.runs):
            results["wekws"].append(
                wekws_epoch(args, config, lists["train"][1], lists["dev"][1], dict_dir, tmp / "model_wekws", utterances)
            )
            results["kwsflow"].append(
                kwsflow_epoch(lists["train"][0], lists["dev"][0], tmp / "model_kwsflow", kwsflow_extra)
            )
        summary = {
            side: {
                "utt_per_s": statistics.median(r["utt_per_s"] for r in runs),
                "runs": [round(r["utt_per_s"], 2) for r in runs],
                "epoch_s": statistics.median(r["epoch_s"] for r in runs),
                "startup_s": statistics.median(r["startup_s"] for r in runs),
                "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                "peak_gib": max(r["peak_gib"] for r in runs),
                "parameters": runs[0]["parameters"],
                "train_utterances": runs[0]["train_utterances"],
                "cv_loss": [round(r["cv_loss"], 4) for r in runs],
            }
            for side, runs in results.items()
        }
        ratio = summary["kwsflow"]["utt_per_s"] / summary["wekws"]["utt_per_s"]
        print(
            f"| side | train utt/s (median of {args.runs}) | runs | epoch s | start-up s | CPU s of the whole run | "
            "peak RSS of the tree | parameters |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for side, label in (("wekws", "WeKws 1a8ee65 (1 worker)"), ("kwsflow", f"kwsflow {args.kwsflow_args}")):
            s = summary[side]
            print(
                f"| {label.strip()} | {s['utt_per_s']:.1f} | {', '.join(f'{x:.1f}' for x in s['runs'])} | "
                f"{s['epoch_s']:.1f} | {s['startup_s']:.1f} | {s['cpu_s']:.0f} | {s['peak_gib']:.2f} GiB | "
                f"{s['parameters']} |"
            )
        print(
            f"ratio kwsflow / WeKws: {ratio:.2f}x ({utterances} training utterances, {PROCESSES} processes x 1 thread, "
            f"{args.config.name}); epoch = training + CV: kwsflow's train_log.tsv, WeKws's log timestamps "
            "(first 'Epoch 0 TRAIN info' to last 'Epoch 0 CV info')"
        )
        if summary["wekws"]["parameters"] != summary["kwsflow"]["parameters"]:
            print(
                f"warning: not the same parameter count: {summary['wekws']['parameters']} (WeKws) vs "
                f"{summary['kwsflow']['parameters']} (kwsflow)"
            )
        if summary["kwsflow"]["train_utterances"] != utterances:
            print(
                f"warning: kwsflow trained on {summary['kwsflow']['train_utterances']} utterances, WeKws {utterances}"
            )
        print(json.dumps({"ratio": round(ratio, 3), "utterances": utterances, "not_in_wekws": dropped, **summary}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
