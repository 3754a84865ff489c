#!/usr/bin/env python
"""Check a split's wav.scp/text/wavs and write its wav.dur and WeKws data.list."""

import argparse

from kws.errors import cli
from kws.lists import make_list


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", required=True, help="a split folder holding wav.scp and text")
    parser.add_argument("--dict", required=True, help="dict/words.txt")
    parser.add_argument("--wav-dur", default=None, help="output wav.dur (default: <data-dir>/wav.dur)")
    parser.add_argument("--data-list", default=None, help="output data.list (default: <data-dir>/data.list)")
    parser.add_argument("--threads", type=int, default=None, help="threads reading wav headers")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    args = parse_args(argv)
    summary = make_list(args.data_dir, args.dict, wav_dur=args.wav_dur, data_list=args.data_list, threads=args.threads)
    print(
        f"{summary['data_list']}: {summary['utterances']} utterances "
        f"({summary['keyword_utterances']} keyword, {summary['filler_utterances']} filler), "
        f"{summary['hours']:.4f} h ({summary['hours'] * 3600:.1f} s)"
    )


if __name__ == "__main__":
    main()
