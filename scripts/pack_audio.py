#!/usr/bin/env python3
"""Decode a split's audio once into a memory-mapped store for training (kws.audio_store)."""

import argparse

from kws.audio_store import AudioStore, build_store
from kws.errors import KwsError, cli


@cli
def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data-list", required=True, help="the split's data.list")
    p.add_argument("--out", required=True, help="store folder to write")
    p.add_argument("--threads", type=int, default=1, help="decoding processes")
    args = p.parse_args()
    if args.threads < 1:
        raise KwsError(f"--threads: must be at least 1, got {args.threads}")
    count = build_store(args.data_list, args.out, threads=args.threads)
    store = AudioStore(args.out)
    print(f"{args.out}: {count} utterances, {store.meta['num_samples'] / 16000 / 3600:.2f} h")


if __name__ == "__main__":
    main()
