#!/usr/bin/env python3
"""Compare runs' metrics.json side by side: a Markdown table (with each experiment's median, min and max
over its seeds), a long-format TSV and a DET plot of every run and keyword. With --heldout-metrics, a
held-out split's metrics of the same runs (corpus.heldout_engine's test_engine) get a section of their own,
with each run at its exported thresholds."""

import argparse
from pathlib import Path

from kws.errors import KwsError, cli
from kws.fileio import atomic_open
from kws.plots import plot_det_compare
from kws.tables import compare_metrics


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metrics", nargs="+", required=True, help="metrics.json files, one per run")
    parser.add_argument(
        "--names", nargs="+", default=None, help="run names (default: the folder above each metrics.json)"
    )
    parser.add_argument(
        "--experiments",
        nargs="+",
        default=None,
        help="the experiment of each run: runs of one experiment (seeds) get a median row",
    )
    parser.add_argument(
        "--heldout-metrics",
        nargs="+",
        default=None,
        help="each run's metrics.json of a held-out split, in the order of --metrics",
    )
    parser.add_argument(
        "--heldout-split", default="test_engine", help="the held-out split's name (default test_engine)"
    )
    parser.add_argument("--out-md", required=True, help="Markdown table to write")
    parser.add_argument("--out-tsv", required=True, help="TSV table to write")
    parser.add_argument("--out-plot", default=None, help="DET comparison PNG to write")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    names = args.names or [Path(p).resolve().parent.name for p in args.metrics]
    if len(names) != len(args.metrics):
        raise KwsError(f"--names: {len(names)} name(s) for {len(args.metrics)} metrics file(s)")
    markdown, tsv = compare_metrics(
        list(zip(names, args.metrics)), args.experiments, heldout=args.heldout_metrics, heldout_split=args.heldout_split
    )
    if args.out_plot:
        from kws.tables import keyword_entries, load_metrics

        groups = []
        for name, path in zip(names, args.metrics):
            folder = Path(path).parent
            groups.append((name, [folder / kw["stats_file"] for kw in keyword_entries(load_metrics(path))]))
        plot_det_compare(groups, args.out_plot)
    with atomic_open(args.out_md) as out:
        out.write("# Experiment comparison\n\n" + markdown)
    with atomic_open(args.out_tsv) as out:
        out.write(tsv)


if __name__ == "__main__":
    main()
