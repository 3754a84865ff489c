#!/usr/bin/env python3
"""Synthesise the default "hi xiaowen" corpus offline with eSpeak NG (wav.scp, text, dict/words.txt)."""

import argparse

from kws.errors import cli


@cli
def main(argv=None):
    from kws.synth import SIZES, summary_line, synthesize_corpus

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", required=True, help="corpus folder (wav/, train/, dev/, test/, dict/)")
    parser.add_argument("--size", default="default", choices=list(SIZES), help="corpus size (default: default)")
    parser.add_argument("--seed", type=int, default=666, help="random seed (default: 666)")
    parser.add_argument("--threads", type=int, default=2, help="worker processes (default: 2)")
    parser.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True,
                        help="noise, babble, reverberation, speed, level and silence (default: on)")
    parser.add_argument("--train-utterances", type=int, default=None,
                        help="training split size instead of the size's own (dev and test unchanged)")
    args = parser.parse_args(argv)
    summary = synthesize_corpus(args.out_dir, size=args.size, seed=args.seed, threads=args.threads,
                                augment=args.augment, train_utterances=args.train_utterances)
    print(summary_line(summary))


if __name__ == "__main__":
    main()
