"""Keyword tokens and names: the one rule from a word to its token (`hey snips` -> `<HEY_SNIPS>`) and from a
token to its name (`<HEY_SNIPS>` -> `hey_snips`, the part of file names such as det/stats.<name>.txt), and
the keywords each corpus has by default. Used by the recipes, the synthesiser, DET, export and the workflow."""

import re

from kws.errors import KwsError

MOBVOI_KEYWORDS = ("<HI_XIAOWEN>", "<NIHAO_WENWEN>")
SNIPS_KEYWORDS = ("<HEY_SNIPS>",)
SPEECH_COMMANDS_DEFAULT = ("yes", "no")
# A corpus's keywords when the config's corpus.keywords is empty (a kaldi corpus has to name them).
DEFAULT_KEYWORDS = {
    "synthetic": MOBVOI_KEYWORDS,
    "mobvoi": MOBVOI_KEYWORDS,
    "snips": SNIPS_KEYWORDS,
    "speech_commands": SPEECH_COMMANDS_DEFAULT,
    "kaldi": (),
}


def keyword_token(word):
    """`yes` -> `<YES>`, `hey snips` -> `<HEY_SNIPS>`; a token already in <...> is kept."""
    word = str(word).strip()
    if re.fullmatch(r"<\S+>", word):
        return word
    name = re.sub(r"[^0-9A-Za-z]+", "_", word).strip("_").upper()
    if not name:
        raise KwsError(f"keyword {word!r}: cannot make a token from it")
    return f"<{name}>"


def keyword_slug(token):
    """`<HI_XIAOWEN>` -> `hi_xiaowen` (the stats file name part)."""
    name = str(token).strip().strip("<>").lower()
    # Only path separators and blanks are replaced.
    return re.sub(r"[\s/\\]+", "_", name) or "keyword"


def corpus_keywords(corpus):
    """Keyword names of the config's corpus section (name, keywords, language), in dictionary order."""
    if corpus["name"] == "synthetic":  # phrases: "hey kws" -> hey_kws (the token <HEY_KWS>)
        from kws.synth.phrases import keyword_names

        return keyword_names(corpus["language"], corpus["keywords"])
    words = corpus["keywords"] or DEFAULT_KEYWORDS[corpus["name"]]
    if not words:
        raise KwsError("config: corpus.keywords must list the keywords of a kaldi corpus")
    return [keyword_slug(keyword_token(word)) for word in words]
