#!/usr/bin/env python3
"""Train several recipes of the default model at once on one GPU and score each on the default test split.

Each row of the sweep file (TSV: name, corpus, seed, average, model, overrides) runs the pipeline's own
scripts in a chain: torchrun train.py (one rank, NCCL) -> average_model.py -> score.py -> compute_det.py.
Not through Snakemake: its one lock per GPU (kws.gpu) would run the trainings one after another, and
these small models leave the GPU mostly idle, so they share it here.
`corpus` is `default` (the workflow's corpus under --results) or `big` (the same dev/test splits, a 4x
training split under <results>/big, made by bench/gpu_session.sh). All runs use the default corpus's
CMVN and its test split, so their figures compare. The summary lists FRR at 0 (no false alarm), 1, 2
and 5 false alarms per hour from the DET stats: at 1 filler-hour the 1 FA/h figure rests on the top two
negative scores, the 5 FA/h one on the top six, so both are shown. The exit status is 1 when a run did
not finish (failed, or stopped at --deadline).

Usage: python bench/gpu_sweep.py --results results_gpu --sweep bench/gpu_sweep.tsv --out sweep.md
"""

import argparse
import csv
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kws.det import operating_point, read_stats  # noqa: E402
from kws.launch import torchrun_command  # noqa: E402

FA_TARGETS = (0.0, 1.0, 2.0, 5.0)


def frr_at(stats_file, target):
    """FRR at the operating point for a FA/h target (kws.det's rule); 1.0 when no threshold meets it."""
    # Zero false alarms are written as ~1e-6 per hour, so the target 0 is taken as 1e-3.
    point = operating_point(read_stats(stats_file), max(target, 1e-3))
    return point["frr"] if point else 1.0


def run_chain(row, args, status):
    """The run's four steps one after another, its state in status[name]; an error is a failed state, not
    a traceback that leaves the run `waiting` in the summary."""
    try:
        _run_chain(row, args, status)
    except Exception as err:  # noqa: BLE001 - the summary reports it; the other runs go on
        status[row["name"]] = (f"failed: {type(err).__name__}: {err}", None)


def _run_chain(row, args, status):
    name = row["name"]
    data = Path(args.results) / "data" / "synthetic"
    train_dir = Path(args.results) / "big" if row["corpus"] == "big" else data
    run_dir = Path(args.results) / "sweep" / name
    run_dir.mkdir(parents=True, exist_ok=True)
    cmvn = next((Path(args.results) / "cmvn").glob("*/global_cmvn"), None)
    if cmvn is None:
        raise FileNotFoundError(f"no {args.results}/cmvn/*/global_cmvn: the workflow has not run there")
    python = sys.executable
    gpu = ["--gpus", "0", "--ddp.dist_backend", "nccl"] if args.device == "cuda" else ["--gpus", "-1"]
    overrides = [arg for item in shlex.split(row["overrides"]) for arg in ("--override", item)]
    steps = [
        [
            *torchrun_command(1, python=python),
            str(REPO / "scripts/train.py"),
            "--config",
            row["model"],
            "--train_data",
            str(train_dir / "train/data.list"),
            "--cv_data",
            str(data / "dev/data.list"),
            "--cmvn_file",
            str(cmvn),
            "--norm_var",
            "--model_dir",
            str(run_dir / "model"),
            "--num_keywords",
            "2",
            "--seed",
            row["seed"],
            "--min_duration",
            "50",
            "--threads",
            "1",
            "--dict",
            str(data / "dict/words.txt"),
            *gpu,
            *overrides,
        ],
        [
            python,
            str(REPO / "scripts/average_model.py"),
            "--model-dir",
            str(run_dir / "model"),
            "--num",
            row["average"],
            "--mode",
            "best",
            "--out",
            str(run_dir / "avg.pt"),
        ],
        [
            python,
            str(REPO / "scripts/score.py"),
            "--checkpoint",
            str(run_dir / "avg.pt"),
            "--test-data",
            str(data / "test/data.list"),
            "--dict",
            str(data / "dict/words.txt"),
            "--out",
            str(run_dir / "score.txt"),
            "--batch-size",
            "64",
            "--device",
            args.device,
        ],
        [
            python,
            str(REPO / "scripts/compute_det.py"),
            "--score",
            str(run_dir / "score.txt"),
            "--test-data",
            str(data / "test/data.list"),
            "--dict",
            str(data / "dict/words.txt"),
            "--out-dir",
            str(run_dir),
            "--experiment",
            name,
        ],
    ]
    begin = time.monotonic()
    with open(run_dir / "log.txt", "w") as log:
        for index, step in enumerate(steps):
            log.write("$ " + shlex.join(step) + "\n")
            log.flush()
            proc = subprocess.Popen(step, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            status[name] = ("running", proc)
            if proc.wait() != 0:
                status[name] = (f"failed at step {index + 1} (see log.txt)", None)
                return
    status[name] = (f"done in {time.monotonic() - begin:.0f} s", None)


def summary(rows, args, status):
    lines = [
        f"| run | corpus | seed | overrides | status | {' | '.join(f'hi @{t:g}' for t in FA_TARGETS)} | "
        f"{' | '.join(f'nihao @{t:g}' for t in FA_TARGETS)} | train / cv loss |",
        "|" + "---|" * (6 + 2 * len(FA_TARGETS)) + "",
    ]
    for row in rows:
        run_dir = Path(args.results) / "sweep" / row["name"]
        cells = []
        for keyword in ("hi_xiaowen", "nihao_wenwen"):
            stats = run_dir / "det" / f"stats.{keyword}.txt"
            cells += [f"{100 * frr_at(stats, t):.1f}" if stats.exists() else "-" for t in FA_TARGETS]
        log = run_dir / "model" / "train_log.tsv"
        losses = "-"
        if log.exists():
            header, *body = [line.split("\t") for line in log.read_text().splitlines()]
            if body:
                last = body[-1]
                losses = f"{float(last[header.index('train_loss')]):.3f} / {float(last[header.index('cv_loss')]):.3f}"
        lines.append(
            f"| {row['name']} | {row['corpus']} | {row['seed']} | {row['overrides'] or '-'} | "
            f"{status[row['name']][0]} | {' | '.join(cells)} | {losses} |"
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True)
    parser.add_argument("--sweep", default=str(REPO / "bench/gpu_sweep.tsv"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--deadline", type=float, default=330, help="seconds before unfinished runs are stopped")
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="", help="comma-separated run names")
    args = parser.parse_args()
    with open(args.sweep) as handle:
        rows = [
            row
            for row in csv.DictReader((line for line in handle if not line.startswith("#")), delimiter="\t")
            if not args.only or row["name"] in args.only.split(",")
        ]
    big = Path(args.results) / "big"
    if any(row["corpus"] == "big" for row in rows):
        subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts/make_list.py"),
                "--data-dir",
                str(big / "train"),
                "--dict",
                str(big / "dict/words.txt"),
                "--threads",
                "8",
            ],
            check=True,
        )
    status = {row["name"]: ("waiting", None) for row in rows}
    threads = [threading.Thread(target=run_chain, args=(row, args, status), daemon=True) for row in rows]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + args.deadline
    while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
        time.sleep(2)
    for name, (_state, proc) in list(status.items()):
        if proc is not None and proc.poll() is None:
            subprocess.run(["pkill", "-TERM", "-s", str(proc.pid)])
            status[name] = ("stopped at the deadline", None)
    table = summary(rows, args, status)
    Path(args.out).write_text(
        f"# Recipe sweep on one GPU ({time.strftime('%Y-%m-%d %H:%M')})\n\n"
        "FRR % at 0 / 1 / 2 / 5 false alarms per hour on the default test split.\n\n" + table
    )
    print(table)
    # Non-zero when a run did not finish (failed or stopped at the deadline): the session log says so.
    return 0 if all(state.startswith("done") for state, _ in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
