#!/usr/bin/env python3
"""Compute a split's fbank features once into a memory-mapped cache (kws.feature_cache)."""

import argparse
import json

from kws.errors import KwsError, cli
from kws.feature_cache import FeatureCache, build_cache


@cli
def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data-list", required=True, help="the split's data.list")
    p.add_argument("--fbank-json", default="{}", help="fbank settings as JSON (dither is ignored: caches use 0)")
    p.add_argument("--out", required=True, help="cache folder to write")
    p.add_argument("--threads", type=int, default=1, help="worker processes")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="stored precision")
    args = p.parse_args()
    try:
        fbank_conf = json.loads(args.fbank_json)
    except json.JSONDecodeError as err:
        raise KwsError(f"--fbank-json: not valid JSON ({err.msg})") from None
    if args.threads < 1:
        raise KwsError(f"--threads: must be at least 1, got {args.threads}")
    count = build_cache(args.data_list, args.out, fbank_conf, threads=args.threads, dtype=args.dtype)
    cache = FeatureCache(args.out)
    print(f"{args.out}: {count} utterances, {cache.meta['num_frames']} frames x {cache.dim} ({cache.meta['dtype']})")


if __name__ == "__main__":
    main()
