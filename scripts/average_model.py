#!/usr/bin/env python3
"""Average N training checkpoints (best by cv loss, or the last N epochs) into one checkpoint."""

import argparse

from kws.average import MODES, average_checkpoints, sidecar_path
from kws.errors import cli


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", required=True, help="training output folder with epoch_NNN.pt/.yaml")
    parser.add_argument("--num", type=int, required=True, help="number of checkpoints to average")
    parser.add_argument("--mode", choices=MODES, default="best", help="best: lowest cv_loss; last: last N epochs")
    parser.add_argument("--out", required=True, help="averaged checkpoint to write (sidecar: same name, .yaml)")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    result = average_checkpoints(args.model_dir, args.num, args.mode, out=args.out)
    epochs = " ".join(str(e) for e in result["averaged_epochs"])
    print(
        f"averaged {len(result['averaged_epochs'])} checkpoints ({args.mode}): epochs {epochs} -> {args.out} "
        f"(+ {sidecar_path(args.out)})"
    )


if __name__ == "__main__":
    main()
