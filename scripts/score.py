#!/usr/bin/env python3
"""Score a test set with a checkpoint: WeKws score.txt (`key KEYWORD p_1 ... p_T` per keyword)."""

import argparse
import logging

from kws.errors import cli
from kws.phone_check import add_phone_check_argument, phone_check_setting
from kws.score import DEFAULT_MAX_BATCH_FRAMES, score


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="checkpoint (e.g. avg.pt)")
    parser.add_argument("--test-data", required=True, help="data.list to score")
    parser.add_argument("--dict", required=True, help="dict/words.txt")
    parser.add_argument("--out", required=True, help="score.txt to write")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--max-batch-frames",
        type=int,
        default=DEFAULT_MAX_BATCH_FRAMES,
        help="cap on padded frames per batch (longer utterances run in cached chunks)",
    )
    add_phone_check_argument(parser)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    alpha, window = phone_check_setting(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    count = score(
        args.checkpoint,
        args.test_data,
        args.dict,
        args.out,
        batch_size=args.batch_size,
        device=args.device,
        threads=args.threads,
        max_batch_frames=args.max_batch_frames,
        phone_check=alpha,
        phone_check_window=window,
    )
    print(f"scored {count} utterances -> {args.out}")


if __name__ == "__main__":
    main()
