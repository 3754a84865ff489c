#!/usr/bin/env python3
"""Choose the phoneme check's alpha and window for a trained model on its dev split: phone_check.json
(kws.phone_choice)."""

import argparse
import logging

from kws.errors import cli
from kws.phone_choice import NEGATIVES, choose_phone_check


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="checkpoint (e.g. avg.pt)")
    parser.add_argument("--dev-data", required=True, help="data.list of the dev split")
    parser.add_argument("--dict", dest="dict_path", required=True, help="dict/words.txt")
    parser.add_argument("--candidates", type=float, nargs="+", required=True, metavar="ALPHA")
    parser.add_argument(
        "--windows", type=int, nargs="+", default=[1], metavar="FRAMES", help="candidate windows (default: 1)"
    )
    parser.add_argument("--negatives", choices=NEGATIVES, default="ordinary", help="negatives FA/h counts")
    parser.add_argument("--fa-target", type=float, default=1.0, help="FA/h at which FRR is compared")
    parser.add_argument("--window-shift", type=int, default=50, help="the DET's hold-off in frames")
    parser.add_argument("--step", type=float, default=0.01, help="threshold step")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", required=True, help="phone_check.json to write")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    choice = choose_phone_check(**vars(args))  # the options are the function's keywords
    table = "; ".join(f"{pair}: {100 * row['mean']:.1f} %" for pair, row in choice.get("dev_frr", {}).items())
    why = table or choice.get("reason")
    chosen = f"alpha {choice['alpha']:g}, window {choice['window']}"
    print(f"phone check {chosen} for {args.checkpoint} ({why}) -> {args.out}")


if __name__ == "__main__":
    main()
