#!/usr/bin/env python3
"""kwsflow's performance benchmarks in one command: prints a table and updates bench/results.md.

    python bench/run.py                 # everything (tens of minutes on 2 cores)
    python bench/run.py --quick         # fewer repetitions, smaller subsets (a few minutes)
    python bench/run.py --skip-pipeline # everything but the end-to-end Snakemake runs
    python bench/run.py --only loss,loader

Sections (each figure the median of --runs runs unless said otherwise):
  loss      kws.loss.max_pooling_loss forward+backward vs a per-utterance loop (bench/loss_reference.py),
            batch 256 x 200 frames, 2 and 100 keywords, one thread
  loader    training DataLoader throughput (decode, fbank, SpecAugment, batching; and from the feature
            cache) at the default worker count vs the default model's training-step throughput
  epoch     one training epoch of the default model (scripts/train.py under torchrun, gloo), 1 and 2
            processes, on-the-fly features and the feature cache
  sort      one epoch of the default model (1 process) with and without length-sorted batches
            (dataset_conf.sort), and the padded frames each computes
  threads   1 process x {1,2} torch threads x {0,1,2} DataLoader workers
  pipeline  the default pipeline's per-rule times (the lead's results/benchmarks, when present) and a
            scoring-only rerun (det.window_shift) of the tiny pipeline in a temporary copy
  score     kws.score real-time factor on the default model config (random weights)

The corpus is results/data/synthetic (a default run's) when present, else a `small` synthetic corpus
made in a temporary folder (the table says which).
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from kws.launch import torchrun_command  # noqa: E402
from machine import cpu_model  # noqa: E402

SECTION = "## Training performance (bench/run.py)"
MODEL = ROOT / "config" / "models" / "ds_tcn_small.yaml"
FBANK = {"num_mel_bins": 40, "frame_length": 25, "frame_shift": 10}
ALL = ("loss", "loader", "epoch", "sort", "threads", "pipeline", "score")


def median_time(fn, runs, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Table:
    def __init__(self):
        self.rows = []

    def add(self, section, what, value, unit, reference="", ratio="", target="", note=""):
        row = [section, what, value, unit, reference, ratio, target, note]
        self.rows.append([str(x) for x in row])
        print(" | ".join(self.rows[-1]), flush=True)

    def markdown(self):
        head = ["section", "measurement", "value", "unit", "reference", "ratio", "target", "note"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


def fmt(x, digits=3):
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


# -- corpus ---------------------------------------------------------------------------------------


def find_corpus(args, tmp):
    if args.corpus:
        return Path(args.corpus), f"{args.corpus} (given)"
    default = ROOT / "results" / "data" / "synthetic"
    if all((default / split / "data.list").is_file() for split in ("train", "dev")):
        # A snapshot: a pipeline running meanwhile may rewrite results/ under the benchmark.
        from kws.datalist import read_data_list, write_data_list

        out = Path(tmp) / "corpus"
        splits = [s for s in ("train", "dev", "test") if (default / s / "data.list").is_file()]
        for split in splits:
            items = read_data_list(default / split / "data.list")
            for item in items:
                src = Path(item["wav"]) if Path(item["wav"]).is_absolute() else ROOT / item["wav"]
                dst = out / "wav" / split / src.name
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
                item["wav"] = str(dst)
            write_data_list(out / split / "data.list", items)
        shutil.copytree(default / "dict", out / "dict")
        return out, (
            f"results/data/synthetic (the default corpus of a default run: {', '.join(splits)}; "
            f"copied to a temporary folder first)"
        )
    out = Path(tmp) / "corpus"
    print(f"default corpus not found: synthesising a `small` corpus in {out}", flush=True)
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "synthesize_corpus.py"),
            "--out-dir",
            str(out),
            "--size",
            "small",
            "--seed",
            "666",
            "--augment",
            "--threads",
            "2",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    for split in ("train", "dev", "test"):
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "make_list.py"),
                "--data-dir",
                str(out / split),
                "--dict",
                str(out / "dict" / "words.txt"),
                "--threads",
                "2",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return out, "a `small` synthetic corpus synthesised in a temporary folder (no default run's corpus found)"


def build_caches(corpus, tmp):
    """The audio stores of train and dev: {split: (folder, seconds to build)}."""
    from kws.audio_store import build_store

    caches = {}
    for split in ("train", "dev"):
        out = Path(tmp) / "store" / split
        start = time.perf_counter()
        build_store(corpus / split / "data.list", out, threads=2)
        caches[split] = (out, time.perf_counter() - start)
    return caches


# -- a: loss --------------------------------------------------------------------------------------


def bench_loss(table, args):
    import torch

    from kws.loss import max_pooling_loss
    from loss_reference import max_pooling_loss_loop

    torch.set_num_threads(1)
    for keywords in (2, 100):
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(256, 200, keywords, generator=g)
        lengths = torch.randint(100, 201, (256,), generator=g)
        targets = torch.randint(-1, keywords, (256,), generator=g)

        # vec and ref are timed within this iteration, so the loop variables they read are this one's.
        def vec():
            x = logits.detach().requires_grad_(True)  # noqa: B023
            max_pooling_loss(x, lengths, targets, 50)[0].backward()  # noqa: B023

        # The loop takes minutes at 100 keywords: time it on a slice and scale (linear in the batch).
        ref_batch = 256 if keywords == 2 else (8 if args.quick else 32)

        def ref():
            x = logits[:ref_batch].detach().requires_grad_(True)  # noqa: B023
            max_pooling_loss_loop(x, lengths[:ref_batch], targets[:ref_batch], 50).backward()  # noqa: B023

        t_vec = median_time(vec, args.runs * 3)
        t_ref = median_time(ref, max(1, args.runs if keywords == 2 else 1), warmup=0) * 256 / ref_batch
        note = "" if ref_batch == 256 else f"loop timed on {ref_batch} utterances x {256 // ref_batch}"
        table.add(
            "a loss",
            f"max_pooling_loss fwd+bwd, 256x200, {keywords} keywords, 1 thread",
            fmt(1000 * t_vec),
            "ms",
            f"{fmt(1000 * t_ref)} ms (loop)",
            f"{t_ref / t_vec:.0f}x",
            ">= 50x" + (", < 20 ms" if keywords == 100 else ""),
            note,
        )


# -- b: loader vs model ---------------------------------------------------------------------------


def bench_loader(table, args, corpus, caches):
    import torch

    from kws.config import load_model_config
    from kws.datalist import read_data_list, read_dictionary
    from kws.dataset import Featurizer, KwsDataset
    from kws.loss import max_pooling_loss
    from kws.model import build_model

    conf = load_model_config(MODEL)
    items = read_data_list(corpus / "train" / "data.list", dictionary=read_dictionary(corpus / "dict" / "words.txt"))
    if args.quick:
        items = items[:600]
    featurize = Featurizer(conf["dataset_conf"])

    def loader_rate():
        torch.set_num_threads(1)
        ds = KwsDataset(
            corpus / "train" / "data.list",
            conf["dataset_conf"],
            items=items,
            rank=0,
            world_size=1,
            store=caches["train"][0],
        )
        count = [0]

        def run():
            count[0] = sum(len(batch[0]) for batch in featurize.batches(ds, 1))

        seconds = median_time(run, args.runs, warmup=0)
        return count[0] / seconds

    cached = loader_rate()

    torch.set_num_threads(1)
    ds = KwsDataset(
        corpus / "train" / "data.list",
        conf["dataset_conf"],
        items=items[:640],
        rank=0,
        world_size=1,
        store=caches["train"][0],
    )
    batches = list(featurize.batches(ds, 1))[:8]
    torch.manual_seed(0)
    model = build_model(conf["model"], 40, 2, None)
    model.train()
    opt = torch.optim.Adam(model.parameters(), **conf["optim_conf"])
    steps = [0, 0]

    def train_steps():
        for _keys, feats, lengths, targets, _warped in batches:
            opt.zero_grad()
            logits, _ = model(feats)
            loss, _ = max_pooling_loss(logits, lengths, targets, 50)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5)
            opt.step()
        steps[0] = sum(len(b[0]) for b in batches)

    t = median_time(train_steps, args.runs)
    model_rate = steps[0] / t
    frames = statistics.mean(float(b[2].float().mean()) for b in batches)
    table.add(
        "b loader",
        "audio store slices + fbank on the batch, 1 thread",
        fmt(cached),
        "utt/s",
        f"{fmt(model_rate)} utt/s (model step, 1 thread)",
        f"{cached / model_rate:.2f}x",
        ">= 3x",
        f"{len(items)} utterances, mean {frames:.0f} frames",
    )
    return model_rate


# -- c / threads: training epochs -----------------------------------------------------------------


def train_epoch(corpus, out, processes, threads, workers, caches=None, train_list=None, overrides=()):
    """One epoch of scripts/train.py under torchrun; returns (epoch seconds, train utt/s) from its log."""
    if out.exists():
        shutil.rmtree(out)
    train_list = train_list or corpus / "train" / "data.list"
    cmd = [
        *torchrun_command(processes, python=sys.executable),
        str(ROOT / "scripts" / "train.py"),
        "--config",
        str(MODEL),
        "--train_data",
        str(train_list),
        "--cv_data",
        str(corpus / "dev" / "data.list"),
        "--model_dir",
        str(out),
        "--num_keywords",
        "2",
        "--min_duration",
        "50",
        "--seed",
        "666",
        "--max_epoch",
        "1",
        "--num_workers",
        str(workers),
        "--threads",
        str(threads * processes),
        "--gpus",
        "-1",
        "--dict",
        str(corpus / "dict" / "words.txt"),
    ]
    for override in overrides:
        cmd += ["--override", override]
    if caches:
        cmd += ["--train_audio_store", str(caches["train"][0]), "--cv_audio_store", str(caches["dev"][0])]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"training failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    with open(out / "train_log.tsv", encoding="utf-8") as handle:
        header, row = [line.rstrip("\n").split("\t") for line in handle.readlines()[:2]]
    row = dict(zip(header, row))
    return float(row["seconds"]), float(row["utts_per_s"])


def median_epoch(runs, *a, **k):
    results = [train_epoch(*a, **k) for _ in range(runs)]
    return statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)


def bench_epoch(table, args, corpus, caches, tmp):
    base = {}
    for processes in args.epoch_processes:
        for label, cache in (("store packed by the trainer", None), ("audio store", caches)):
            seconds, rate = median_epoch(args.runs, corpus, Path(tmp) / "epoch", processes, 1, 1, cache)
            key = (processes, label)
            base[key] = seconds
            ref = base.get((processes, "store packed by the trainer"))
            table.add(
                "c epoch",
                f"1 epoch, {processes} process(es) x 1 thread, 1 worker, {label}",
                fmt(rate),
                "utt/s",
                "" if cache is None else f"{fmt(ref)} s packing included",
                "" if cache is None else f"{ref / seconds:.2f}x",
                "",
                f"epoch {fmt(seconds)} s incl. CV",
            )


def padded_frames(corpus, sort):
    """(padded, real) frames of one epoch's training batches of the default model config, 1 process."""
    from kws.config import load_model_config
    from kws.datalist import read_dictionary
    from kws.dataset import Featurizer, KwsDataset

    conf = load_model_config(MODEL)["dataset_conf"]
    conf = dict(conf, sort=sort, spec_aug=False, fbank_conf=dict(conf["fbank_conf"], dither=0.0))
    padded = real = 0
    dataset = KwsDataset(
        corpus / "train" / "data.list",
        conf,
        rank=0,
        world_size=1,
        dictionary=read_dictionary(corpus / "dict" / "words.txt"),
    )
    for _, feats, lengths, _, _ in Featurizer(conf).batches(dataset, 0):
        padded += feats.shape[0] * feats.shape[1]
        real += int(lengths.sum())
    return padded, real


def bench_sort(table, args, corpus, tmp):
    base = None
    for sort in (False, True):
        seconds, rate = median_epoch(
            args.runs, corpus, Path(tmp) / "sort", 1, 1, 1, overrides=[f"dataset_conf.sort={str(sort).lower()}"]
        )
        padded, real = padded_frames(corpus, sort)
        base = base or seconds
        table.add(
            "c sort",
            f"1 epoch, 1 process x 1 thread, 1 worker, sort {'on' if sort else 'off'}",
            fmt(rate),
            "utt/s",
            "" if not sort else f"{fmt(base)} s unsorted",
            "" if not sort else f"{base / seconds:.2f}x",
            "",
            f"epoch {fmt(seconds)} s incl. CV; padded frames {padded / real:.2f}x the real ones",
        )


def bench_threads(table, args, corpus, caches, tmp):
    from kws.datalist import read_data_list, write_data_list

    items = read_data_list(corpus / "train" / "data.list")[: (300 if args.quick else 600)]
    subset = Path(tmp) / "subset.list"
    write_data_list(subset, items)
    for label, cache in (("on-the-fly", None), ("cache", caches)):
        for threads in (1, 2):
            for workers in (0, 1, 2):
                seconds, rate = median_epoch(
                    args.runs, corpus, Path(tmp) / "sweep", 1, threads, workers, cache, train_list=subset
                )
                table.add(
                    "threads",
                    f"1 process x {threads} thread(s) x {workers} worker(s), {label}",
                    fmt(rate),
                    "utt/s",
                    "",
                    "",
                    "",
                    f"epoch {fmt(seconds)} s, {len(items)} utts + CV",
                )


# -- d: pipeline ----------------------------------------------------------------------------------


def bench_pipeline(table, args, tmp):
    sys.path.insert(0, str(ROOT / "tests"))
    from workflow_utils import TINY_CONFIG, make_workdir, planned_jobs, snakemake, write_config

    bench_dir = ROOT / "results" / "benchmarks"
    tsvs = sorted(bench_dir.glob("*.tsv")) if bench_dir.is_dir() else []
    if tsvs and (ROOT / "results" / "ds_tcn_small" / "metrics.json").is_file():
        total = 0.0
        per_rule = {}
        for path in tsvs:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
            seconds = float(lines[1].split("\t")[0])
            rule = path.stem.split(".")[0]
            per_rule[rule] = per_rule.get(rule, 0.0) + seconds
            total += seconds
        for rule, seconds in sorted(per_rule.items(), key=lambda kv: -kv[1]):
            table.add(
                "d pipeline",
                f"default pipeline: {rule}",
                fmt(seconds),
                "s",
                "",
                "",
                "",
                "results/benchmarks (lead's default run), one run",
            )
        table.add(
            "d pipeline",
            "default pipeline: sum of job times",
            fmt(total),
            "s",
            "",
            "",
            "",
            "jobs run 2 at a time where independent, so wall time is at most this",
        )
    else:
        table.add(
            "d pipeline",
            "default pipeline",
            "n/a",
            "",
            "",
            "",
            "",
            "no finished default run in results/ (run `snakemake --cores 2` and re-run the bench)",
        )

    work = make_workdir(Path(tmp) / "pipeline")
    config = json.loads(json.dumps(TINY_CONFIG))
    start = time.perf_counter()
    first = snakemake(work, timeout=1800)
    full = time.perf_counter() - start
    if first.returncode != 0:
        raise RuntimeError(f"tiny pipeline failed:\n{first.stderr[-3000:]}")
    config["det"]["window_shift"] = 40
    write_config(work, config)
    start = time.perf_counter()
    second = snakemake(work, timeout=1800)
    rerun = time.perf_counter() - start
    jobs = planned_jobs(second)
    table.add("d pipeline", "tiny pipeline from an empty results folder", fmt(full), "s", "", "", "", "one run")
    table.add(
        "d pipeline",
        "rerun after det.window_shift 50 -> 40",
        fmt(rerun),
        "s",
        f"{fmt(full)} s full",
        f"{100 * rerun / full:.1f}%",
        "< 5%, no training",
        "jobs: "
        + ", ".join(f"{k} {v}" for k, v in sorted(jobs.items()) if k != "total")
        + ("; train: NOT rerun" if "train" not in jobs else "; train RERAN"),
    )


# -- e: scoring -----------------------------------------------------------------------------------


def bench_score(table, args, corpus, tmp):
    import torch

    from kws.config import load_model_config
    from kws.datalist import read_data_list, write_data_list
    from kws.model import build_model
    from kws.score import score

    conf = load_model_config(MODEL)
    torch.manual_seed(0)
    model = build_model(conf["model"], 40, 2, None)
    ckpt = Path(tmp) / "random.pt"
    torch.save({"model": model.state_dict(), "config": conf, "num_keywords": 2, "input_dim": 40, "epoch": "avg"}, ckpt)
    split = "test" if (corpus / "test" / "data.list").is_file() else "dev"
    items = read_data_list(corpus / split / "data.list")
    limit = 900.0 if args.quick else 3600.0
    chosen, seconds = [], 0.0
    for item in items:
        if seconds + float(item["duration"]) > limit and chosen:
            continue
        chosen.append(item)
        seconds += float(item["duration"])
    test = Path(tmp) / "score_test.list"
    write_data_list(test, chosen)
    cpu = []
    wall = []
    for _ in range(args.runs):
        c0, w0 = time.process_time(), time.perf_counter()
        score(
            ckpt, test, corpus / "dict" / "words.txt", Path(tmp) / "score.txt", batch_size=64, device="cpu", threads=1
        )
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    c, w = statistics.median(cpu), statistics.median(wall)
    table.add(
        "e score",
        "kws.score, ds_tcn_small (random weights), 1 thread",
        fmt(seconds / c),
        "audio s / CPU s",
        f"wall: {fmt(seconds / w)} audio s / s",
        "",
        "",
        f"{len(chosen)} {split} utterances, {seconds / 60:.1f} min of audio (decode + fbank + model + write)",
    )


# -- results.md -----------------------------------------------------------------------------------


def previous_rows(text, sections):
    """Table rows of the existing section whose benchmark was not run this time (kept, marked)."""
    match = re.search(re.escape(SECTION) + r"\n(.*?)(?=\n## |\Z)", text, re.S)
    kept = []
    for line in match.group(1).splitlines() if match else []:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0] not in ("section",) and not set(cells[0]) <= set("-"):
            name = cells[0].split()[-1]
            if name not in sections and not (name == "cache" and set(sections) & {"loader", "epoch", "threads"}):
                if "(earlier run)" not in cells[7]:
                    cells[7] = (cells[7] + " (earlier run)").strip()
                kept.append(cells)
    return kept


def write_results(table, header, commands, sections):
    path = ROOT / "bench" / "results.md"
    text = path.read_text(encoding="utf-8") if path.is_file() else "# kwsflow benchmarks\n"
    kept = previous_rows(text, sections)
    if kept:
        table.rows = kept + table.rows
        header += " Rows marked (earlier run) come from an earlier invocation and were kept."
        match = re.search(re.escape(SECTION) + r"\n.*?\nCommands: (.*?)\n", text, re.S)
        if match and commands not in match.group(1):
            commands = f"{match.group(1).replace(' (this run)', '')}, then {commands} (this run)"
    body = f"{SECTION}\n\n{header}\n\nCommands: {commands}\n\n{table.markdown()}\n"
    pattern = re.compile(re.escape(SECTION) + r"\n.*?(?=\n## |\Z)", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: body.rstrip("\n"), text)
    else:
        text = text.rstrip("\n") + "\n\n" + body
    path.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions and smaller subsets")
    p.add_argument("--skip-pipeline", action="store_true", help="skip the Snakemake pipeline runs")
    p.add_argument("--only", default=",".join(ALL), help=f"comma-separated sections ({','.join(ALL)})")
    p.add_argument("--runs", type=int, default=None, help="repetitions per figure (default 3, quick 1)")
    p.add_argument("--corpus", default=None, help="corpus folder (default: results/data/synthetic, else small)")
    p.add_argument("--epoch-processes", type=int, nargs="+", default=[1, 2], help="torchrun processes (epoch)")
    p.add_argument("--no-write", action="store_true", help="print only, leave bench/results.md alone")
    args = p.parse_args()
    args.runs = args.runs or (1 if args.quick else 3)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    if args.skip_pipeline and "pipeline" in sections:
        sections.remove("pipeline")
    import torch

    load = os.getloadavg()
    header = (
        f"Machine: nproc = {os.cpu_count()}, {cpu_model()}; torch {torch.__version__}, Python "
        f"{platform.python_version()}; torch.get_num_threads() = {torch.get_num_threads()} at start, "
        f"OMP_NUM_THREADS = {os.environ.get('OMP_NUM_THREADS', 'unset')}. Thread settings per figure are in "
        f"its row (benchmarks pin 1 torch thread unless the row says otherwise). Median of {args.runs} "
        f"run(s) per figure unless noted. Measured {datetime.datetime.now():%Y-%m-%d %H:%M}, load average "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} over {os.cpu_count()} CPUs (a shared, noisy machine: "
        f"compare ratios measured in the same run)."
    )
    from kws.config import load_model_config

    model_conf = load_model_config(MODEL)
    header += (
        f" Default model {MODEL.name} as measured: batch_size "
        f"{model_conf['dataset_conf']['batch_conf'].get('batch_size')}, hidden_dim "
        f"{model_conf['model']['hidden_dim']}, backbone dropout "
        f"{model_conf['model']['backbone'].get('dropout')}."
    )
    table = Table()
    print(header)
    with tempfile.TemporaryDirectory(prefix="kwsbench.") as tmp:
        corpus = caches = None
        if set(sections) & {"loader", "epoch", "sort", "threads", "score"}:
            corpus, corpus_note = find_corpus(args, tmp)
            header += f"\n\nCorpus: {corpus_note}."
            print(f"corpus: {corpus_note}")
        if set(sections) & {"loader", "epoch", "threads"}:
            caches = build_caches(corpus, tmp)
            table.add(
                "cache",
                "build the train feature cache (2 processes)",
                fmt(caches["train"][1]),
                "s",
                "",
                "",
                "",
                "scripts/cache_features.py, float32, one run",
            )
        for name in sections:
            if name == "loss":
                bench_loss(table, args)
            elif name == "loader":
                bench_loader(table, args, corpus, caches)
            elif name == "epoch":
                bench_epoch(table, args, corpus, caches, tmp)
            elif name == "sort":
                bench_sort(table, args, corpus, tmp)
            elif name == "threads":
                bench_threads(table, args, corpus, caches, tmp)
            elif name == "pipeline":
                bench_pipeline(table, args, tmp)
            elif name == "score":
                bench_score(table, args, corpus, tmp)
            else:
                raise SystemExit(f"unknown section {name!r} ({', '.join(ALL)})")
    print(table.markdown())
    if not args.no_write:
        write_results(
            table,
            header,
            f"`python bench/run.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
            [
                {
                    "loss": "loss",
                    "loader": "loader",
                    "epoch": "epoch",
                    "sort": "sort",
                    "threads": "threads",
                    "pipeline": "pipeline",
                    "score": "score",
                }[x]
                for x in sections
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
