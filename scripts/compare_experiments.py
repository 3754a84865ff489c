#!/usr/bin/env python3
"""Compare experiments' metrics.json side by side: a Markdown table and a long-format TSV."""

import argparse
from pathlib import Path

from kws.det import compare_metrics
from kws.errors import KwsError, cli
from kws.fileio import atomic_open


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metrics", nargs="+", required=True, help="metrics.json files")
    parser.add_argument("--names", nargs="+", default=None,
                        help="experiment names (default: the folder above each metrics.json)")
    parser.add_argument("--out-md", required=True, help="Markdown table to write")
    parser.add_argument("--out-tsv", required=True, help="TSV table to write")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    names = args.names or [Path(p).resolve().parent.name for p in args.metrics]
    if len(names) != len(args.metrics):
        raise KwsError(f"--names: {len(names)} name(s) for {len(args.metrics)} metrics file(s)")
    markdown, tsv = compare_metrics(list(zip(names, args.metrics)))
    with atomic_open(args.out_md) as out:
        out.write("# Experiment comparison\n\n" + markdown)
    with atomic_open(args.out_tsv) as out:
        out.write(tsv)


if __name__ == "__main__":
    main()
