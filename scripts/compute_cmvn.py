#!/usr/bin/env python
"""Global CMVN statistics (WeKws global_cmvn JSON) of fbank features over a data.list."""

import argparse
import json

from kws.cmvn import compute_cmvn_file
from kws.config import load_model_config, parse_overrides
from kws.errors import KwsError, cli
from kws.features import fbank_conf_of, inference_fbank


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-list", required=True, help="training data.list")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model-config", default=None, help="model YAML; its dataset_conf.fbank_conf is used")
    source.add_argument("--fbank-json", default=None, help="fbank settings as JSON, e.g. '{\"num_mel_bins\": 40}'")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted model-config override (with --model-config), value parsed as YAML",
    )
    parser.add_argument("--threads", type=int, default=1, help="worker processes")
    parser.add_argument("--out", required=True, help="output global_cmvn")
    return parser.parse_args(argv)


def fbank_conf_from_args(args):
    if args.override and not args.model_config:
        raise KwsError("--override: needs --model-config")
    if args.model_config:
        conf = load_model_config(args.model_config, parse_overrides(args.override))
        return inference_fbank(fbank_conf_of(conf["dataset_conf"], f"{args.model_config}: dataset_conf"))
    if args.fbank_json:
        try:
            fbank = json.loads(args.fbank_json)
        except json.JSONDecodeError as err:
            raise KwsError(f"--fbank-json: malformed JSON ({err.msg})") from None
        if not isinstance(fbank, dict):
            raise KwsError("--fbank-json: expected a JSON object")
        return fbank
    return {}


@cli
def main(argv=None):
    args = parse_args(argv)
    if args.threads < 1:
        raise KwsError(f"--threads: must be at least 1, got {args.threads}")
    stats = compute_cmvn_file(args.data_list, args.out, fbank_conf_from_args(args), threads=args.threads)
    print(f"{args.out}: {stats['frame_num']} frames, {len(stats['mean_stat'])} dims")


if __name__ == "__main__":
    main()
