#!/usr/bin/env python3
"""DET statistics per keyword (WeKws semantics) and a metrics summary (JSON, TSV, Markdown)."""

import argparse

from kws.det import DEFAULT_FA_TARGETS, compute_det
from kws.errors import cli


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--score", required=True, help="score.txt (key KEYWORD p_1 ... p_T)")
    parser.add_argument("--test-data", required=True, help="test data.list (labels and durations)")
    parser.add_argument("--dict", required=True, help="dict/words.txt")
    parser.add_argument("--step", type=float, default=0.01, help="threshold step (thresholds 0 .. <1)")
    parser.add_argument(
        "--window-shift", type=int, default=50, help="frames skipped after a false alarm before the next can count"
    )
    parser.add_argument(
        "--fa-targets",
        type=float,
        nargs="+",
        default=list(DEFAULT_FA_TARGETS),
        help="false alarms per hour at which to report FRR",
    )
    parser.add_argument(
        "--experiment",
        default=None,
        help="experiment name recorded in the metrics (default: the --out-dir folder name)",
    )
    parser.add_argument("--out-dir", required=True, help="folder for metrics.json, metrics.tsv, metrics.md")
    parser.add_argument(
        "--stats-dir", default=None, help="folder for the per-keyword stats.<keyword>.txt (default: <out-dir>/det)"
    )
    parser.add_argument(
        "--reference-metrics",
        default=None,
        help="metrics.json of another test set (the one the export takes its thresholds from): this test "
        "set's errors at those thresholds go into each keyword's at_reference_threshold",
    )
    parser.add_argument(
        "--reference-fa-target",
        type=float,
        default=1.0,
        help="the FA/h operating point of --reference-metrics whose thresholds are applied (default 1)",
    )
    parser.add_argument(
        "--reference-negatives",
        choices=("all", "ordinary"),
        default="ordinary",
        help="which negatives that operating point's FA/h counts (as export_model.py --negatives)",
    )
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    reference = None
    if args.reference_metrics:
        from kws.datalist import keyword_names, read_dictionary
        from kws.tables import recommended_thresholds

        chosen = recommended_thresholds(
            args.reference_metrics,
            keyword_names(read_dictionary(args.dict)),
            args.reference_fa_target,
            negatives=args.reference_negatives,
        )
        where = f"{args.reference_metrics} at {args.reference_fa_target:g} FA/h ({args.reference_negatives} negatives)"
        # the chosen point's own FRR and FA/h belong to the other test set: name only where it came from
        reference = {
            token: (threshold, source if source.startswith("default") else where)
            for token, (threshold, source) in chosen.items()
        }
    metrics = compute_det(
        args.score,
        args.test_data,
        args.dict,
        args.out_dir,
        step=args.step,
        window_shift=args.window_shift,
        fa_targets=args.fa_targets,
        experiment=args.experiment,
        stats_dir=args.stats_dir,
        reference_thresholds=reference,
    )
    for kw in metrics["keywords"].values():
        parts = []
        for point in kw["operating_points"]:
            frr = "n/a" if point["frr"] is None else f"{point['frr']:.4f}"
            parts.append(f"FRR@{point['fa_per_hour_target']:g}FA/h={frr}")
        print(f"{kw['token']}: {kw['num_positives']} positives, {kw['filler_hours']:.3f} filler h; " + ", ".join(parts))


if __name__ == "__main__":
    main()
