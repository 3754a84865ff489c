#!/usr/bin/env python3
"""Export a checkpoint for streaming inference: model.onnx + model.pt (TorchScript) + export.json.

Both take (feats [1, T, D], cache) and return (posteriors [1, T, K], new_cache). They are checked at
export time against the PyTorch model on test utterances, whole and chunk by chunk (max abs difference
<= --tolerance, recorded in export.json); a mismatch is an error and nothing is written. With --score, the
ONNX model also runs through the streaming detector over the whole test list (kws.deployed).
"""

import argparse

from kws.detect import DEFAULT_CHUNK_MS, DEFAULT_REFRACTORY
from kws.errors import cli
from kws.export import DEFAULT_FA_TARGET, EXPORT_TOLERANCE, OPSET, export_model
from kws.phone_check import add_phone_check_argument, phone_check_setting


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="checkpoint to export (e.g. avg.pt)")
    parser.add_argument("--dict", required=True, help="dict/words.txt (keyword tokens, stored in the metadata)")
    parser.add_argument("--metrics", help="metrics.json of compute_det: recommended thresholds per keyword")
    parser.add_argument(
        "--fa-target",
        type=float,
        default=DEFAULT_FA_TARGET,
        help=f"FA/h operating point whose threshold is recommended (default {DEFAULT_FA_TARGET:g})",
    )
    parser.add_argument(
        "--negatives",
        choices=("all", "ordinary"),
        default="ordinary",
        help="which negatives the FA/h of --fa-target counts: all (WeKws's) or ordinary (without the test "
        "set's near-misses and partial keywords; metrics.md's second table)",
    )
    parser.add_argument("--test-data", required=True, help="data.list whose utterances check the exports")
    parser.add_argument("--num-utts", type=int, default=8, help="utterances to check (default 8)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=EXPORT_TOLERANCE,
        help=f"max abs posterior difference (default {EXPORT_TOLERANCE:g})",
    )
    parser.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    parser.add_argument(
        "--score",
        default=None,
        help="score.txt of --test-data: the ONNX model then also runs as kws-detect does over all of "
        "--test-data, and must agree with it at the exported thresholds (export.json: deployed)",
    )
    parser.add_argument(
        "--refractory",
        type=float,
        default=DEFAULT_REFRACTORY,
        help=f"the detector's refractory period in seconds (default {DEFAULT_REFRACTORY:g})",
    )
    parser.add_argument("--window-shift", type=int, default=50, help="the DET's hold-off in frames (default 50)")
    parser.add_argument(
        "--chunk-ms",
        type=float,
        default=DEFAULT_CHUNK_MS,
        help=f"audio per detector step in ms (default {DEFAULT_CHUNK_MS:g})",
    )
    parser.add_argument("--threads", type=int, default=1, help="processes running the detector (default 1)")
    add_phone_check_argument(parser)
    parser.add_argument("--out-dir", required=True, help="folder for model.onnx, model.pt, export.json")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    alpha, window = phone_check_setting(args)
    report = export_model(
        args.checkpoint,
        args.dict,
        args.out_dir,
        args.test_data,
        metrics=args.metrics,
        num_utts=args.num_utts,
        fa_target=args.fa_target,
        negatives=args.negatives,
        tolerance=args.tolerance,
        opset=args.opset,
        score=args.score,
        refractory=args.refractory,
        window_shift=args.window_shift,
        chunk_ms=args.chunk_ms,
        workers=args.threads,
        phone_check=alpha,
        phone_check_window=window,
    )
    diffs = {backend: max(values.values()) for backend, values in report["check"]["max_abs_diff"].items()}
    thresholds = " ".join(f"{kw}={t:g}" for kw, t in report["meta"]["thresholds"].items())
    print(
        f"exported {args.checkpoint} -> {args.out_dir}/model.onnx, model.pt "
        f"(checked on {len(report['check']['utterances'])} utterances: max |diff| onnx {diffs['onnx']:.2g}, "
        f"torchscript {diffs['torchscript']:.2g}); thresholds {thresholds}"
    )
    for token, fig in report.get("deployed", {}).get("keywords", {}).items():
        stream, offline = fig["streaming"], fig["offline_window_shift"]
        print(
            f"deployed {token} at {fig['threshold']:g}: streaming FRR {100 * stream['frr']:.2f} % "
            f"({stream['misses']}/{stream['positives']}), {stream['fa_per_hour']:.2f} FA/h "
            f"({stream['false_alarms']} in {stream['filler_hours']:.2f} h); "
            f"offline FRR {100 * offline['frr']:.2f} %, "
            f"{offline['fa_per_hour']:.2f} FA/h"
        )


if __name__ == "__main__":
    main()
