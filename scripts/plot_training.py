#!/usr/bin/env python3
"""Training curves from a model folder's train_log.tsv: losses, cv accuracy, learning rate, gradient norm."""

import argparse

from kws.errors import cli
from kws.plots import plot_training


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log", required=True, help="<model_dir>/train_log.tsv")
    parser.add_argument("--title", default=None, help="experiment name for the title")
    parser.add_argument("--out", required=True, help="PNG to write")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    plot_training(args.log, args.out, title=args.title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
