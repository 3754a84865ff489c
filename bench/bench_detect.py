#!/usr/bin/env python3
"""Real-time factor of the streaming detector (kws.detect.Detector) on one CPU core.

For each model config (random weights: speed does not depend on them) the model is exported
(ONNX + TorchScript, with the export-time check), then `--seconds` of audio is fed in --chunk-ms
chunks through incremental fbank + model + decisions; RTF = wall time / audio duration, median of
--runs runs. Prints Markdown rows and updates the "Streaming detector" section of bench/results.md.

    python bench/bench_detect.py [--seconds 60] [--runs 5] [--chunk-ms 100]
"""

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from machine import cpu_model  # noqa: E402

SECTION = "## Streaming detector (bench/bench_detect.py)"
CONFIGS = ("ds_tcn_small.yaml", "ds_tcn.yaml")


def build(config_name, out_dir):
    from kws.config import load_model_config
    from kws.export import build_metadata, export_artifacts
    from kws.model import build_model, count_parameters

    conf = load_model_config(ROOT / "config" / "models" / config_name)
    dim = int(conf["dataset_conf"]["fbank_conf"]["num_mel_bins"])
    torch.manual_seed(0)
    model = build_model(conf["model"], dim, 2, None).eval()
    meta = build_metadata(model, conf, ["<HI_XIAOWEN>", "<NIHAO_WENWEN>"], {"<HI_XIAOWEN>": 0.5, "<NIHAO_WENWEN>": 0.5})
    feats = torch.randn(1, 50, dim, generator=torch.Generator().manual_seed(1)) + 10
    export_artifacts(model, meta, out_dir, [("bench", feats[0])], chunks=(10,))
    return model, meta, count_parameters(model)


class FbankOnly:
    """No model: zero posteriors, to show what incremental fbank + decisions cost alone."""

    backend = "fbank only"

    def __init__(self, meta):
        self.meta = meta

    def init_cache(self):
        return None

    def run(self, feats, cache):
        return np.zeros((1, feats.shape[1], self.meta["num_keywords"]), dtype=np.float32), cache


def time_detector(runner, audio, chunk_samples, runs):
    from kws.detect import Detector

    detector = Detector(runner, refractory=1.0)
    walls, cpus = [], []
    for _ in range(runs + 1):  # the first run warms up
        detector.reset()
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(0, audio.size, chunk_samples):
            detector.accept(audio[i : i + chunk_samples])
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls[1:]), statistics.median(cpus[1:])


def update_results(path, rows, header_lines):
    path = Path(path)
    text = path.read_text() if path.exists() else "# kwsflow benchmarks\n"
    block = "\n".join([SECTION, "", *header_lines, "", *rows]) + "\n"
    if SECTION in text:
        before, rest = text.split(SECTION, 1)
        after = rest.split("\n## ", 1)
        tail = ("\n## " + after[1]) if len(after) > 1 else ""
        text = before + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block
    from kws.fileio import atomic_open

    with atomic_open(path) as out:
        out.write(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="audio per run (default 60)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per model and backend (median; default 5)")
    parser.add_argument("--chunk-ms", type=float, nargs="+", default=[100.0], help="chunk sizes (default 100 ms)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), help="config/models/*.yaml names")
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["torchscript", "onnx", "pytorch", "fbank"],
        help="torchscript, onnx, pytorch (eager), fbank (no model)",
    )
    parser.add_argument("--results", default=str(ROOT / "bench" / "results.md"), help="Markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    from kws.export import EagerRunner
    from kws.runners import load_exported

    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(int(args.seconds * 16000))).astype(np.float32)
    rows = [
        "| model | params | backend | chunk ms | audio s | median wall s | RTF (wall) | RTF (CPU time) |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(rows), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for config_name in args.configs:
            out = Path(tmp) / config_name
            model, meta, params = build(config_name, out)
            for backend in args.backends:
                if backend == "fbank" and config_name != args.configs[0]:
                    continue  # the same for every model
                if backend == "pytorch":
                    runner = EagerRunner(model, meta)
                elif backend == "fbank":
                    runner = FbankOnly(meta)
                else:
                    runner = load_exported(out / ("model.onnx" if backend == "onnx" else "model.pt"), threads=1)
                for chunk_ms in args.chunk_ms:
                    chunk_samples = int(round(16 * chunk_ms))
                    wall, cpu = time_detector(runner, audio, chunk_samples, args.runs)
                    name = "(none) | -" if backend == "fbank" else f"{config_name} | {params / 1000:.0f} K"
                    row = (
                        f"| {name} | {runner.backend} | {chunk_ms:g} | {args.seconds:g} "
                        f"| {wall:.3f} | {wall / args.seconds:.4f} | {cpu / args.seconds:.4f} |"
                    )
                    rows.append(row)
                    print(row, flush=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" over {os.cpu_count()} CPUs"
    header = [
        f"Machine: `nproc` = {os.cpu_count()}, {cpu_model()}; one thread (torch.set_num_threads(1), "
        f"onnxruntime intra_op 1); torch {torch.__version__}, Python {platform.python_version()}.",
        f"Random weights; {args.seconds:g} s of noise fed in chunks through incremental "
        f"fbank + model + threshold/refractory; median of {args.runs} runs after a warm-up run. "
        f"RTF = time / audio (target <= 0.01); CPU time is this process's, less sensitive to other jobs. "
        f"Measured {time.strftime('%Y-%m-%d %H:%M')}, load average {load}.",
    ]
    if not args.no_write:
        update_results(args.results, rows, header)
        print(f"updated {args.results}", file=sys.stderr)


if __name__ == "__main__":
    main()
