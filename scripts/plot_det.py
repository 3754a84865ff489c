#!/usr/bin/env python3
"""DET curves (FRR % vs false alarms per hour): one experiment, or a comparison of several.

One experiment:   plot_det.py --stats det/stats.a.txt det/stats.b.txt [--labels a b] --title exp --out det.png
Compare (files):  plot_det.py --compare --stats exp1/det/stats.a.txt exp2/det/stats.a.txt ... --out cmp.png
                  (the experiment of a file is the folder above det/; --labels renames the experiments)
Compare (dirs):   plot_det.py --compare --dirs results/exp1 results/exp2 [--labels e1 e2] --out cmp.png
"""

import argparse

from kws.errors import KwsError, cli
from kws.plots import DEFAULT_TARGETS, group_stats_by_experiment, plot_det, plot_det_compare, stats_in_dir


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stats", nargs="+", default=[], help="stats.<keyword>.txt files")
    parser.add_argument("--dirs", nargs="+", default=[], help="metrics folders to compare (implies --compare)")
    parser.add_argument(
        "--labels",
        nargs="+",
        default=None,
        help="curve labels (one per stats file), or experiment names with --compare",
    )
    parser.add_argument("--compare", action="store_true", help="one curve per experiment and keyword")
    parser.add_argument("--title", default=None, help="experiment name for the title")
    parser.add_argument(
        "--fa-targets",
        type=float,
        nargs="*",
        default=list(DEFAULT_TARGETS),
        help="FA/h values marked by vertical lines",
    )
    parser.add_argument("--out", required=True, help="PNG to write")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    if not args.stats and not args.dirs:
        raise KwsError("give --stats files or --dirs folders")
    if args.dirs or args.compare:
        groups = group_stats_by_experiment(args.stats) if args.stats else []
        if args.dirs:
            from pathlib import Path

            groups += [(Path(d).resolve().name, stats_in_dir(d)) for d in args.dirs]
        if args.labels:
            if len(args.labels) != len(groups):
                raise KwsError(f"--labels: {len(args.labels)} name(s) for {len(groups)} experiment(s)")
            groups = [(label, paths) for label, (_, paths) in zip(args.labels, groups)]
        plot_det_compare(groups, args.out, title=args.title, fa_targets=args.fa_targets)
    else:
        plot_det(args.stats, args.out, labels=args.labels, title=args.title, fa_targets=args.fa_targets)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
