"""The embedded default corpus, synthesised offline with eSpeak NG (see kws.synth.corpus)."""

from kws.synth.corpus import SIZES, plan_corpus, summary_line, synthesize_corpus

__all__ = ["SIZES", "plan_corpus", "summary_line", "synthesize_corpus"]
