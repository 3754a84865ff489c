"""Keyword tokens and names: the one rule from a word to its token (`hey snips` -> `<HEY_SNIPS>`) and from a
token to its name (`<HEY_SNIPS>` -> `hey_snips`, the part of file names such as det/stats.<name>.txt).
Used by the recipes, the synthesiser, DET, export, detection and the workflow (kws.recipes.corpus_keywords)."""

import re

from kws.errors import KwsError


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
