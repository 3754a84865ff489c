#!/usr/bin/env python3
"""Export a checkpoint for streaming inference: model.onnx + model.pt (TorchScript) + export.json.

Both take (feats [1, T, D], cache) and return (posteriors [1, T, K], new_cache). They are checked at
export time against the PyTorch model on test utterances, whole and chunk by chunk (max abs difference
<= --tolerance, recorded in export.json); a mismatch is an error and nothing is written.
"""

import argparse

from kws.errors import cli
from kws.export import DEFAULT_FA_TARGET, OPSET, export_model


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="checkpoint to export (e.g. avg.pt)")
    parser.add_argument("--dict", required=True, help="dict/words.txt (keyword tokens, stored in the metadata)")
    parser.add_argument("--metrics", help="metrics.json of compute_det: recommended thresholds per keyword")
    parser.add_argument("--fa-target", type=float, default=DEFAULT_FA_TARGET,
                        help=f"FA/h operating point whose threshold is recommended (default {DEFAULT_FA_TARGET:g})")
    parser.add_argument("--test-data", required=True, help="data.list whose utterances check the exports")
    parser.add_argument("--num-utts", type=int, default=8, help="utterances to check (default 8)")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="max abs posterior difference (default 1e-5)")
    parser.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    parser.add_argument("--out-dir", required=True, help="folder for model.onnx, model.pt, export.json")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    report = export_model(args.checkpoint, args.dict, args.out_dir, args.test_data, metrics=args.metrics,
                          num_utts=args.num_utts, fa_target=args.fa_target, tolerance=args.tolerance,
                          opset=args.opset)
    diffs = {backend: max(values.values()) for backend, values in report["check"]["max_abs_diff"].items()}
    thresholds = " ".join(f"{kw}={t:g}" for kw, t in report["meta"]["thresholds"].items())
    print(f"exported {args.checkpoint} -> {args.out_dir}/model.onnx, model.pt "
          f"(checked on {len(report['check']['utterances'])} utterances: max |diff| onnx {diffs['onnx']:.2g}, "
          f"torchscript {diffs['torchscript']:.2g}); thresholds {thresholds}")


if __name__ == "__main__":
    main()
