#!/usr/bin/env python3
"""The GPU check for a session that has a CUDA machine (about 2 minutes): one script, one table.

1. The training step alone: WeKws's DS-TCN (config/models/ds_tcn.yaml, hidden 256, 287 K parameters) at
   batch 256 x 200 frames on one pre-made batch, with the trainer's optimizer and step
   (kws.trainer.make_optimizer: fused Adam; optimizer_step: clip, then step): fp32, bf16 autocast and
   torch.compile (measured last, as it takes the longest; skipped on a CPU: inductor's C++ build takes
   minutes there); GPU utilisation sampled with nvidia-smi meanwhile. Also the default model's step in
   the precision it trains in, for 3.'s ratio.
2. The data path alone: utterances/s of the training batches (audio store slices, fbank and SpecAugment
   on the device: kws.dataset), gathered from the store's copy on the GPU and, for a corpus too big for
   it, assembled by the host, against the best eager step; that both give the same features; the host
   syncs (torch.cuda's sync debug mode) in the trainer's loop over those batches, which should be none
   but the epoch's end.
3. End-to-end training through the real data path: `torchrun --nproc_per_node 1 scripts/train.py` (GPU 0,
   or `--gpus -1` on a CPU; one rank starts no process group), the workflow's way (no --pin_memory), of
   ds_tcn.yaml and of the default model (ds_tcn_small.yaml), both at batch 256. Corpus: a small synthetic
   one, its training split repeated to --utterances (keys renamed) so that an epoch lasts long enough to
   time at GPU rates; the audio stores are packed once for both runs. From train_log.tsv: utterances/s of
   the epochs after the first (which pays for CUDA start-up and the allocator's growth; an epoch includes
   its CV pass over the dev split), its ratio to the same model's step alone in the precision the trainer
   resolves, and the projected wall time of 80 epochs of 130,000 utterances (Mobvoi scale) at that rate.

Each row is written to --out as soon as it is measured, so a run cut short keeps what it measured. The
exit status is 1 when a measurement failed (its row says why).

Usage: python bench/gpu_check.py [--out bench/gpu_results.md] [--device cpu]  (cpu: a dry run of the code)
       python bench/gpu_check.py --device cpu --batch 8 --steps 2 --corpus-size tiny --utterances 16 --epochs 2
       (the readiness run of tests/test_gpu_session.py: minutes of CPU instead of hours)
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kws.audio_store import build_store  # noqa: E402
from kws.config import load_model_config  # noqa: E402
from kws.datalist import read_dictionary  # noqa: E402
from kws.dataset import Featurizer, KwsDataset, input_dim_of  # noqa: E402
from kws.distributed import Dist  # noqa: E402
from kws.launch import torchrun_command  # noqa: E402
from kws.loss import criterion, max_pooling_loss  # noqa: E402
from kws.model import build_model, count_parameters  # noqa: E402
from kws.trainer import NonFiniteGuard, TrainState, make_optimizer, optimizer_step, resolve_precision, train_one_epoch  # noqa: E402
from kws.trainlog import read_tsv  # noqa: E402

WEKWS_MODEL = REPO / "config/models/ds_tcn.yaml"
DEFAULT_MODEL = REPO / "config/models/ds_tcn_small.yaml"
NUM_KEYWORDS = 2
MIN_DURATION = 50
# What the projection is for: Mobvoi hi_xiaowen's training split, trained for WeKws's recipe's 80 epochs.
MOBVOI_UTTERANCES, MOBVOI_EPOCHS = 130_000, 80


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


def model_label(config):
    """`ds_tcn.yaml (287 K)`: the config and the parameter count of its model with two keywords."""
    conf = load_model_config(config)
    model = build_model(conf["model"], input_dim_of(conf["dataset_conf"]), NUM_KEYWORDS, None)
    return f"{config.name} ({count_parameters(model) / 1000:.0f} K)"


def step_throughput(device, mode, config=WEKWS_MODEL, steps=30, batch=256, frames=200):
    """Utterances/s of the training step alone on one pre-made batch, and the GPU's busy % meanwhile
    (None without nvidia-smi). As many warm-up steps as timed ones, at most 5."""
    conf = load_model_config(config)
    input_dim = input_dim_of(conf["dataset_conf"])
    model = build_model(conf["model"], input_dim, NUM_KEYWORDS, None).to(device)
    optimizer = make_optimizer(model, conf.get("optim_conf"), config)
    grad_clip = float(conf["training_config"]["grad_clip"])
    forward = torch.compile(model) if mode == "compile" else model
    feats = torch.randn(batch, frames, input_dim, device=device)
    lengths = torch.full((batch,), frames, device=device)
    targets = torch.randint(-1, NUM_KEYWORDS, (batch,), device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mode == "bf16"):
            logits, _ = forward(feats)
        loss, _ = max_pooling_loss(logits.float(), lengths, targets, MIN_DURATION)
        loss.backward()
        optimizer_step(model, optimizer, grad_clip)

    for _ in range(min(steps, 5)):
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
    utilisation = sum(samples) / len(samples) if samples else None
    return steps * batch / seconds, utilisation


def synthesize_corpus(corpus, size):
    """A synthetic corpus of `size` with data.list files for its train and dev splits."""
    run = [sys.executable, str(REPO / "scripts/synthesize_corpus.py"), "--out-dir", str(corpus), "--size", size]
    subprocess.run([*run, "--threads", "8"], check=True, capture_output=True)
    for split in ("train", "dev"):
        make_list = [sys.executable, str(REPO / "scripts/make_list.py"), "--data-dir", str(corpus / split)]
        subprocess.run([*make_list, "--dict", str(corpus / "dict/words.txt")], check=True, capture_output=True)


def repeated_list(source, out, utterances):
    """`source`'s data.list repeated, keys suffixed with the repetition, up to `utterances` lines: an
    epoch long enough to time at GPU rates from a corpus that synthesises in seconds. Returns the mean
    duration in seconds."""
    items = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    repeated = []
    for index in range(utterances):
        item = items[index % len(items)]
        repeated.append(dict(item, key=f"{item['key']}_r{index // len(items)}"))
    out.write_text("".join(json.dumps(item) + "\n" for item in repeated))
    return sum(float(item["duration"]) for item in repeated) / len(repeated)


def dataset_of(config, data_list, store, dictionary, batch, overrides=None):
    """(KwsDataset of rank 0 of 1, seed 666, the model config) of `config` + `overrides` at `batch`."""
    conf = load_model_config(config, {"dataset_conf.batch_conf.batch_size": batch, **(overrides or {})})
    dataset = KwsDataset(
        data_list, conf["dataset_conf"], seed=666, rank=0, world_size=1, dictionary=dictionary, store=store
    )
    return dataset, conf


def training_data(data_list, store, dictionary, device, batch, store_on_device=True):
    """(KwsDataset, Featurizer) of the trainer's data path for ds_tcn.yaml's dataset_conf at `batch`."""
    dataset, conf = dataset_of(WEKWS_MODEL, data_list, store, dictionary, batch)
    return dataset, Featurizer(conf["dataset_conf"], device=device, store_on_device=store_on_device)


def loader_throughput(data_list, store, dictionary, device, batch, batches=30, store_on_device=True):
    """Steady-state utterances/s of the training data path (audio store slices, fbank and SpecAugment on
    `device`: kws.dataset, as the trainer builds it) over `batches` batches after the first, epochs back
    to back. `store_on_device`: batches gathered from the store's copy on the GPU (the trainer's way when
    it fits), else assembled by the host (pinned, prefetched by a thread)."""
    dataset, featurize = training_data(data_list, store, dictionary, device, batch, store_on_device)
    count, seen, start = 0, 0, None
    for epoch in range(1, 1000):
        for _keys, feats, _lengths, _targets, _warped in featurize.batches(dataset, epoch):
            if start is None:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            else:
                count += len(feats)
            seen += 1
            if seen > batches:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                return count / (time.perf_counter() - start)
    return float("nan")


def paths_agree(data_list, store, dictionary, device, batch, batches=4):
    """Whether the features of the first `batches` batches gathered from the store's copy on the device
    equal, bit for bit, those of host-assembled batches (same dither and SpecAugment draws)."""
    results = []
    for on_device in (True, False):
        dataset, featurize = training_data(data_list, store, dictionary, device, batch, on_device)
        results.append([feats.cpu() for _, feats, _, _, _ in itertools.islice(featurize.batches(dataset, 1), batches)])
    same = all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    return f"{'yes' if same else 'NO'} ({len(results[0])} batches of {batch})"


def host_syncs(data_list, store, dictionary, device, batch, steps):
    """Synchronising CUDA calls (torch.cuda.set_sync_debug_mode: each one makes the host wait for the
    device) in `steps` steps of the trainer's loop (kws.trainer.train_one_epoch) of the default model,
    its batches made by the real data path. Returns (syncs, steps run); syncs is None off CUDA."""
    dataset, conf = dataset_of(DEFAULT_MODEL, data_list, store, dictionary, batch)
    input_dim = input_dim_of(conf["dataset_conf"])
    model = build_model(conf["model"], input_dim, NUM_KEYWORDS, None).to(device)
    tc = conf["training_config"]
    state = TrainState(
        model=model,
        bare_model=model,
        optimizer=make_optimizer(model, conf.get("optim_conf"), DEFAULT_MODEL),
        criterion=criterion(tc["criterion"]),
        dist=Dist(1, device, "gloo"),
        device=device,
        input_dim=input_dim,
        min_duration=MIN_DURATION,
        grad_clip=float(tc["grad_clip"]),
        guard=NonFiniteGuard(20),
        log_interval=10_000,  # past the steps run: what remains is the per-step syncs and the epoch's end
    )
    dataset.set_epoch(1)
    counts = [min(steps, dataset.batch_counts()[0])]
    batches = Featurizer(conf["dataset_conf"], device=device).batches(dataset, 1)
    if device.type != "cuda":
        train_one_epoch(state, batches, 1, counts)
        return None, counts[0]
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_one_epoch(state, batches, 1, counts)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught), counts[0]


# Length-sorted batches that keep the class mix (kws.dataset, `stratify`), sorted over 10 batches of 256.
SORTED = {"dataset_conf.sort": True, "dataset_conf.stratify": True, "dataset_conf.sort_conf.sort_size": 2560}


def padding(config, data, dictionary, batch, overrides):
    """(padded frames over real ones, mean padded length in frames) of the first epoch's batches of
    `config` + `overrides` on `data`'s training list: what a step pays for, beside what it learns from."""
    dataset, _ = dataset_of(config, data["train"], data["train_store"], dictionary, batch, overrides)
    dataset.set_epoch(1)
    plan = dataset.plan(0)
    longest = sum(max(int(dataset.batch_frames[i]) for i in items) for items in plan) / len(plan)
    return dataset.padding(0), longest


def end_to_end(config, data, workdir, device, batch, epochs, overrides=None):
    """One-process torchrun of scripts/train.py on `data` (lists and audio stores), with `overrides` of
    the config; returns (utterances/s of the epochs after the first, or of the only one, and which epochs
    those are)."""
    overrides = overrides or {}
    model_dir = workdir / f"e2e_{config.stem}{'_sorted' if overrides else ''}"
    gpu = ["--gpus", "0", "--ddp.dist_backend", "nccl"] if device.type == "cuda" else ["--gpus", "-1"]
    command = [
        *torchrun_command(1, python=sys.executable),
        str(REPO / "scripts/train.py"),
        *("--config", str(config), "--model_dir", str(model_dir), "--max_epoch", str(epochs)),
        *("--override", f"dataset_conf.batch_conf.batch_size={batch}"),
        *(arg for key, value in overrides.items() for arg in ("--override", f"{key}={value}")),
        *("--train_data", str(data["train"]), "--train_audio_store", str(data["train_store"])),
        *("--cv_data", str(data["dev"]), "--cv_audio_store", str(data["dev_store"])),
        *("--num_keywords", str(NUM_KEYWORDS), "--min_duration", str(MIN_DURATION), "--dict", str(data["dict"])),
        *gpu,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        # kws.errors.cli's `error: ...` line says why; torchrun's own summary follows it
        lines = result.stderr.strip().splitlines() or [f"rc {result.returncode}"]
        raise RuntimeError(f"train.py: {next((line for line in lines if line.startswith('error:')), lines[-1])}")
    rows = read_tsv(model_dir / "train_log.tsv", epochs + 1)
    timed = rows[1:] or rows
    seconds = sum(float(row["seconds"]) for row in timed)
    utterances = sum(float(row["utts_per_s"]) * float(row["seconds"]) for row in timed)
    span = timed[0]["epoch"] if len(timed) == 1 else f"{timed[0]['epoch']}-{timed[-1]['epoch']}"
    return utterances / seconds, span


def projected(rate):
    """Wall time of MOBVOI_EPOCHS epochs of MOBVOI_UTTERANCES utterances at `rate` utterances/s."""
    seconds = MOBVOI_EPOCHS * MOBVOI_UTTERANCES / rate
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


class Table:
    """The markdown table, rewritten to `path` after every row; `failed` says whether a row failed."""

    def __init__(self, path, title):
        self.path = Path(path)
        self.lines = [f"# {title}", "", f"torch {torch.__version__}, measured {time.strftime('%Y-%m-%d %H:%M')}", ""]
        self.lines += ["| what | figure |", "|---|---|"]
        self.failed = False
        self.path.write_text("\n".join(self.lines) + "\n")

    def row(self, what, measure):
        """Add `| what | measure() |`; an exception becomes the row's figure (this is a measurement script:
        report and go on)."""
        try:
            figure = measure()
        except Exception as err:  # noqa: BLE001
            figure = f"failed: {type(err).__name__}: {str(err)[:200]}"
            self.failed = True
        self.lines.append(f"| {what} | {figure} |")
        print(self.lines[-1], flush=True)
        self.path.write_text("\n".join(self.lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "bench" / "gpu_results.md"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=256, help="batch size of every measurement (default 256)")
    parser.add_argument(
        "--steps", type=int, default=None, help="timed steps per mode, and batches of 2. (default 30; 2 on a CPU)"
    )
    parser.add_argument("--corpus-size", default="small", help="synthetic corpus size for 2. and 3. (default small)")
    parser.add_argument(
        "--utterances", type=int, default=12_800, help="training utterances of 3.'s epochs (default 12,800)"
    )
    parser.add_argument("--epochs", type=int, default=4, help="epochs of 3.; the first is not timed (default 4)")
    parser.add_argument(
        "--only-training",
        action="store_true",
        help="the fp32 steps and 3. alone, sorted batches first (a lease's last minutes: about a minute)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    steps = args.steps or (30 if device.type == "cuda" else 2)
    title = f"GPU check ({torch.cuda.get_device_name(0) if device.type == 'cuda' else 'cpu dry run'})"
    table = Table(args.out, title)
    labels = {config: model_label(config) for config in (WEKWS_MODEL, DEFAULT_MODEL)}

    step_rates = {}  # (config, mode) -> utterances/s of the step alone

    def measure_step(config, mode):
        rate, utilisation = step_throughput(device, mode, config, steps=steps, batch=args.batch)
        step_rates[config, mode] = rate
        busy = f", GPU {utilisation:.0f}%" if utilisation is not None else ""
        return f"{rate:.0f} utt/s{busy}"

    for mode in ("fp32",) if args.only_training else ("fp32", "bf16"):
        table.row(
            f"{labels[WEKWS_MODEL]} step, batch {args.batch} x 200, {mode}",
            lambda mode=mode: measure_step(WEKWS_MODEL, mode),
        )
    # The precision each model trains in on this device (training_config.precision, `auto` resolved).
    # (--only-training: fp32, whose step rows it measured)
    precisions = {
        config: "fp32"
        if args.only_training
        else resolve_precision(load_model_config(config)["training_config"].get("precision", "fp32"), device, config)
        for config in labels
    }
    for config, precision in precisions.items():
        if (config, precision) not in step_rates:
            what = f"{labels[config]} step, batch {args.batch} x 200, {precision}"
            table.row(what, lambda config=config, precision=precision: measure_step(config, precision))

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        corpus = workdir / "corpus"
        synthesize_corpus(corpus, args.corpus_size)
        data = {"train": workdir / "train.list", "dev": corpus / "dev/data.list", "dict": corpus / "dict/words.txt"}
        mean_seconds = repeated_list(corpus / "train/data.list", data["train"], args.utterances)
        threads = len(os.sched_getaffinity(0))
        for split in ("train", "dev"):
            data[f"{split}_store"] = workdir / f"audio_{split}"
            build_store(data[split], data[f"{split}_store"], threads=threads)
        dictionary = read_dictionary(data["dict"])
        best = max(step_rates.values(), default=0.0)

        for on_device, how in (
            ()
            if args.only_training
            else ((True, "store on the device"), (False, "host batches, pinned and prefetched"))
        ):

            def measure_loader(on_device=on_device):
                rate = loader_throughput(
                    data["train"], data["train_store"], dictionary, device, args.batch, steps, on_device
                )
                return f"{rate:.0f} utt/s = {rate / max(best, 1e-9):.2f}x the best eager step"

            table.row(f"data path alone ({WEKWS_MODEL.name} features), batch {args.batch}, {how}", measure_loader)
        if not args.only_training:
            table.row(
                "features of batches gathered on the device equal host batches'",
                lambda: paths_agree(data["train"], data["train_store"], dictionary, device, args.batch),
            )

        def measure_syncs():
            syncs, ran = host_syncs(data["train"], data["train_store"], dictionary, device, args.batch, steps)
            if syncs is None:
                return f"not measurable on {device.type} (the loop ran {ran} steps)"
            return f"{syncs} in {ran} steps, the epoch's end included ({syncs / ran:.2f} a step)"

        what = f"host syncs of the training loop and data path, {labels[DEFAULT_MODEL]}, batch {args.batch}"
        if not args.only_training:
            table.row(what, measure_syncs)
        # Sorted batches first when short of time: the unsorted rows were measured on an earlier lease.
        batching = [(SORTED, ", sort + stratify (sort_size 2560)"), ({}, "")]
        for overrides, how in batching[:: 1 if args.only_training else -1]:
            for config, precision in precisions.items():

                def measure_training(config=config, precision=precision, overrides=overrides):
                    padded, longest = padding(config, data, dictionary, args.batch, overrides)
                    rate, span = end_to_end(config, data, workdir, device, args.batch, args.epochs, overrides)
                    step = step_rates.get((config, precision))
                    # The step alone ran at 200 frames; a training batch is as long as its longest utterance.
                    ratio = (
                        f"{rate / step:.2f}x the {precision} step alone in utterances, "
                        f"{rate * longest / (step * 200):.2f}x in padded frames"
                        if step
                        else "no step figure to compare"
                    )
                    return (
                        f"{rate:.0f} utt/s (epochs {span} of {args.utterances:,} utterances of {mean_seconds:.1f} s "
                        f"on average, CV included; batches padded to {longest:.0f} frames on average, "
                        f"{padded:.2f}x the real frames) = {ratio}; projected "
                        f"{MOBVOI_EPOCHS} epochs x {MOBVOI_UTTERANCES:,} utterances: {projected(rate)}"
                    )

                what = (
                    f"end-to-end training (torchrun, train.py), {labels[config]}, batch {args.batch}, {precision}{how}"
                )
                table.row(what, measure_training)
    # Last: compiling takes the longest, and the end-to-end figures above must not wait for it.
    what = f"{labels[WEKWS_MODEL]} step, batch {args.batch} x 200, compile"
    if device.type == "cpu":  # inductor's C++ build of the model takes minutes on a CPU
        table.row(what, lambda: "skipped on CPU")
    elif not args.only_training:
        table.row(what, lambda: measure_step(WEKWS_MODEL, "compile"))
    print(f"written {args.out}")
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
