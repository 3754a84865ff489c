#!/usr/bin/env python3
"""Synthesise a keyword corpus offline (wav.scp, text, utt2voice per split, dict/words.txt): by default
"hi xiaowen" / "nihao wenwen" with eSpeak NG; any phrase in any eSpeak NG language with --keywords."""

import argparse

from kws.errors import cli


@cli
def main(argv=None):
    from kws.synth import SIZES, summary_line, synthesize_corpus
    from kws.synth.augment import SPEAKER_TRANSFORMS
    from kws.synth.corpus import VARIANT_SHARE, CorpusSpec
    from kws.synth.engines import ENGINES

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out-dir", required=True, help="corpus folder (wav/, train/, dev/, test/, dict/)")
    parser.add_argument("--size", default="default", choices=list(SIZES), help="corpus size (default: default)")
    parser.add_argument("--seed", type=int, default=666, help="random seed (default: 666)")
    parser.add_argument("--threads", type=int, default=2, help="worker processes (default: 2)")
    parser.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="noise, babble, reverberation, speed, level and silence (default: on)",
    )
    parser.add_argument(
        "--train-utterances",
        type=int,
        default=None,
        help="training split size instead of the size's own (dev and test unchanged)",
    )
    parser.add_argument("--language", default="cmn", help="eSpeak NG language code of the keywords (default: cmn)")
    parser.add_argument(
        "--keywords",
        nargs="*",
        default=[],
        help="keyword phrases (default: the language's built-in ones; cmn: hi_xiaowen nihao_wenwen)",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["espeak"],
        choices=ENGINES,
        help="engines of train, dev and test (default: espeak)",
    )
    parser.add_argument(
        "--heldout-engine",
        default=None,
        choices=ENGINES,
        help="an engine heard only in an extra test split, test_engine",
    )
    parser.add_argument(
        "--speaker-augment",
        nargs="*",
        default=[],
        choices=SPEAKER_TRANSFORMS,
        help="speaker augmentation transforms (default: none)",
    )
    parser.add_argument(
        "--neighbours",
        action="store_true",
        help="the built-in Mandarin phrases: train also on near-misses made from the phrases, as any phrase's are",
    )
    parser.add_argument(
        "--near-miss-share",
        type=float,
        default=None,
        help="the training split's share of near-misses and partial phrases (default: the phrases' own)",
    )
    parser.add_argument(
        "--variant-share",
        type=float,
        default=VARIANT_SHARE,
        help="with speaker augmentation variants: the share of the training eSpeak utterances said by drawn voices",
    )
    args = parser.parse_args(argv)
    spec = CorpusSpec(
        language=args.language,
        keywords=args.keywords,
        engines=args.engines,
        heldout_engine=args.heldout_engine,
        speaker_augment=args.speaker_augment,
        neighbours=args.neighbours,
        near_miss_share=args.near_miss_share,
        variant_share=args.variant_share,
    )
    summary = synthesize_corpus(
        args.out_dir,
        size=args.size,
        seed=args.seed,
        threads=args.threads,
        augment=args.augment,
        train_utterances=args.train_utterances,
        spec=spec,
    )
    print(summary_line(summary))


if __name__ == "__main__":
    main()
