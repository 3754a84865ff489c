#!/usr/bin/env python
"""Prepare a real corpus in the kwsflow layout: <out>/dict/words.txt, <out>/{train,dev,test}/{wav.scp,text}."""

import argparse

from kws.errors import cli
from kws.recipes import CORPORA, prepare_corpus


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--corpus",
        required=True,
        choices=CORPORA,
        help="mobvoi (OpenSLR 87), speech_commands (v2), snips (Hey Snips) or kaldi (a prepared folder)",
    )
    parser.add_argument("--root", required=True, help="the corpus as downloaded and unpacked")
    parser.add_argument("--out-dir", required=True, help="where dict/ and train/ dev/ test/ are written")
    parser.add_argument(
        "--keywords",
        nargs="+",
        default=None,
        help="speech_commands: words to spot (default: yes no; `all` for every word); "
        "kaldi: keyword tokens instead of <root>/dict/words.txt",
    )
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    summary = prepare_corpus(args.corpus, args.root, args.out_dir, args.keywords)
    print(f"{args.corpus}: wrote {summary['out_dir']} (keywords: {' '.join(summary['keywords'])})")
    for split, info in summary["splits"].items():
        counts = ", ".join(f"{token} {n}" for token, n in info["tokens"].items())
        print(f"  {split}: {info['utterances']} utterances ({counts})")
    for note in summary["notes"]:
        print(f"  note: {note}")


if __name__ == "__main__":
    main()
