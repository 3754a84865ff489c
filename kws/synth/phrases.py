"""What the synthetic corpus says: keyword phrases, their confusable negatives, and filler speech.

A profile turns (language, keyword phrases) into utterance kinds, their shares, and a text generator per
kind. Two profiles, one corpus builder (kws.synth.corpus):

- `MandarinDefault`: the default corpus (hi_xiaowen, nihao_wenwen) with its hand-written texts and
  near-misses, drawing exactly what it always drew (same seed -> the same corpus as before).
- `PhraseProfile`: any phrase in any language eSpeak NG speaks. Tokens come from the phrase
  ("hey kws" -> <HEY_KWS>); confusables are made from the phrase: partial phrases, reordered words, words
  (or letters of a spelled word, or Hanzi) swapped for phonetic neighbours found with eSpeak's phonemizer
  in a shipped word list, and phoneme-level neighbours spoken as eSpeak phoneme input (`[[...]]`, eSpeak
  only); filler speech in the phrase's language (shipped sentences where there are, else numbers eSpeak
  reads in that language) and in others; pseudo-words.
"""

import itertools
import re

from kws.errors import KwsError
from kws.keywords import keyword_slug

FILLER = "<FILLER>"
ENGLISH_ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc", "en-gb-x-gbclan")

# --- texts -----------------------------------------------------------------------------------------
HI_TEXTS = ("嗨小问", "嗨，小问", "嗨小问。", "嗨小问！", "嗨 小问")
NIHAO_TEXTS = ("你好问问", "你好，问问", "你好问问。", "你好问问！", "你好 问问")
HI_PINYIN = ("hai1 xiao3 wen4", "hai1, xiao3 wen4")
NIHAO_PINYIN = ("ni3 hao3 wen4 wen4", "ni3 hao3, wen4 wen4")
# Hard negatives: partial keywords and near-misses that differ in at least one syllable. Variants that
# differ from a keyword only in tone (嗨小文, 你好闻闻, 海小问, ni2 hao3 wen4 wen4 - which is how 你好问问
# is actually said, with tone sandhi) are left out: eSpeak renders them nearly alike and a model on
# fbank features cannot tell them apart, so labelling them filler taught the keywords as noise.
HARD_TEXTS = (
    "你好",
    "问问",
    "小问",
    "嗨",
    "你好问",
    "小问问",
    "嗨小",
    "好问问",
    "嗨小王",
    "嗨小吴",
    "你好呀",
    "你好啊问问",
    "问问你好",
    "小问嗨",
    "你好问题",
    "你好我问问",
    "你问问",
    "你好温暖",
    "你好问一下",
    "你好小问",
    "嗨问问",
    "嗨你好",
    "你好你好",
    "小问你好",
    "你好万万",
    "你好慢慢",
    "嗨小雨",
    "嗨小龙",
    "请问问他",
    "你好吗",
    "我问问",
)
HARD_PINYIN = (
    "ni3 hao3",
    "wen4 wen4",
    "xiao3 wen4",
    "hai1",
    "ni3 hao3 wen4",
    "xiao3 wen4 wen4",
    "hai1 xiao3 wang2",
    "ni3 hao3 wan4 wan4",
    "hai1 xiao3 yu3",
)
COMMANDS = (
    "今天天气怎么样",
    "播放音乐",
    "现在几点了",
    "打开灯",
    "关掉空调",
    "明天会下雨吗",
    "设置一个闹钟",
    "给妈妈打电话",
    "音量调大一点",
    "导航到公司",
    "讲个笑话",
    "下一首",
    "暂停",
    "打开电视",
)
SUBJECTS = (
    "我",
    "你",
    "他",
    "她",
    "我们",
    "你们",
    "他们",
    "老师",
    "妈妈",
    "爸爸",
    "小明",
    "同学们",
    "大家",
    "我的朋友",
    "医生",
    "这个人",
    "邻居",
    "老板",
    "孩子们",
    "司机",
)
TIMES = ("", "", "今天", "明天", "昨天", "现在", "晚上", "早上", "周末", "下午", "刚才", "每天")
PREDICATES = (
    "去超市买东西",
    "在家看电视",
    "想吃火锅",
    "要去上班",
    "在学校学习",
    "打电话给朋友",
    "听音乐",
    "看一本书",
    "坐地铁回家",
    "去公园散步",
    "做晚饭",
    "开会",
    "写作业",
    "玩游戏",
    "休息一下",
    "学习中文",
    "喝咖啡",
    "打扫房间",
    "去医院看病",
    "买了新手机",
    "坐飞机去北京",
    "在办公室加班",
    "跑步锻炼身体",
    "去银行取钱",
    "修理自行车",
    "准备考试",
    "在厨房洗碗",
    "看足球比赛",
    "去图书馆借书",
    "给孩子讲故事",
    "种了很多花",
    "在网上买衣服",
    "等公交车",
    "参加婚礼",
    "去海边旅游",
    "学习开车",
    "包饺子",
    "问问题",
    "写一封信",
)
PARTICLES = ("", "", "", "了", "吧", "吗", "呢", "啊")
QUESTIONS = COMMANDS + (
    "这个多少钱",
    "你叫什么名字",
    "我们什么时候出发",
    "请把门关上",
    "谢谢你的帮助",
    "没关系",
    "我不知道",
    "欢迎光临",
    "慢走",
    "祝你生日快乐",
    "新年快乐",
    "请稍等一下",
    "对不起我来晚了",
    "好久不见",
)
HANZI = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后"
    "小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长"
    "知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最"
    "间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市"
)
PINYIN_INITIALS = (
    "",
    "b",
    "p",
    "m",
    "f",
    "d",
    "t",
    "n",
    "l",
    "g",
    "k",
    "h",
    "j",
    "q",
    "x",
    "zh",
    "ch",
    "sh",
    "r",
    "z",
    "c",
    "s",
    "y",
    "w",
)
PINYIN_FINALS = (
    "a",
    "o",
    "e",
    "ai",
    "ei",
    "ao",
    "ou",
    "an",
    "en",
    "ang",
    "eng",
    "ong",
    "i",
    "u",
    "ia",
    "ie",
    "iao",
    "iu",
    "ian",
    "in",
    "iang",
    "ing",
    "ua",
    "uo",
    "uai",
    "ui",
    "uan",
    "un",
    "uang",
)
ENGLISH = (
    "hey what time is it",
    "turn on the lights",
    "hi there",
    "hello",
    "how are you doing today",
    "set an alarm for seven",
    "play some music",
    "what's the weather like",
    "call my mother",
    "I'll be there in five minutes",
    "can you hear me",
    "thank you very much",
    "good morning everyone",
    "where did I put my keys",
    "let's go for a walk",
    "the meeting starts at ten",
    "open the window please",
    "I don't know",
    "see you tomorrow",
    "how much does it cost",
    "hey Siri",
    "okay Google",
    "Alexa, stop",
    "hi Sharon",
    "knee how",
    "nice to meet you",
    "when is the next train",
    "please stop the music",
    "turn the volume down",
    "what's for dinner tonight",
    "I really like this song",
    "excuse me",
    "happy birthday",
    "we need more milk",
    "it is raining again",
    "shall we start",
    "hello, when when",
)
ENGLISH_WORDS = (
    "the",
    "a",
    "cat",
    "dog",
    "car",
    "red",
    "big",
    "small",
    "house",
    "walk",
    "run",
    "today",
    "morning",
    "light",
    "music",
    "phone",
    "water",
    "coffee",
    "please",
    "now",
    "later",
    "when",
    "where",
    "shower",
    "how",
    "high",
    "hi",
    "window",
    "show",
    "new",
    "one",
    "two",
    "three",
)


def _banned(text):
    compact = text.replace("，", "").replace(",", "").replace(" ", "")
    return "你好问问" in compact or "嗨小问" in compact


def _zh_sentence(rng):
    if rng.random() < 0.25:
        return rng.choice(QUESTIONS)
    when = rng.choice(TIMES)
    who = rng.choice(SUBJECTS)
    text = f"{when}{who}{rng.choice(PREDICATES)}" if rng.random() < 0.5 else f"{who}{when}{rng.choice(PREDICATES)}"
    if rng.random() < 0.3:
        text += "，" + rng.choice(("然后", "所以", "但是", "因为")) + rng.choice(SUBJECTS) + rng.choice(PREDICATES)
    return text + rng.choice(PARTICLES) + rng.choice(("。", "。", "？", "！", ""))


def _english(rng):
    if rng.random() < 0.7:
        return rng.choice(ENGLISH)
    return " ".join(rng.choice(ENGLISH_WORDS) for _ in range(rng.randint(2, 7)))


def _syllables(rng):
    if rng.random() < 0.5:
        return "cmn", "".join(rng.choice(HANZI) for _ in range(rng.randint(2, 8)))
    syl = [
        rng.choice(PINYIN_INITIALS) + rng.choice(PINYIN_FINALS) + str(rng.randint(1, 5))
        for _ in range(rng.randint(2, 7))
    ]
    return "cmn-latn-pinyin", " ".join(syl)


class MandarinDefault:
    """The default corpus's two Mandarin keywords, kinds and texts."""

    language = "cmn"
    tokens = ("<HI_XIAOWEN>", "<NIHAO_WENWEN>")
    positive = {"hi": "<HI_XIAOWEN>", "nihao": "<NIHAO_WENWEN>"}
    # share of each utterance kind (positives ~30 %)
    kind_share = {"hi": 0.15, "nihao": 0.15, "hard": 0.2, "zh": 0.22, "syl": 0.1, "en": 0.12, "yue": 0.06}
    # No hard negatives in streams: back to back, partial keywords (嗨 + 小问问) can form a keyword.
    stream_kind_share = {"zh": 0.45, "syl": 0.2, "en": 0.25, "yue": 0.1}
    babble_kinds = ("zh", "zh", "en", "yue")
    kind_languages = {
        "hi": "cmn",
        "nihao": "cmn",
        "hard": "cmn",
        "zh": "cmn",
        "syl": "cmn-latn-pinyin",  # its syllable strings are pinyin: a Hanzi-only engine cannot say them
        "en": "en",
        "yue": "yue",
    }
    commands = COMMANDS  # said after a keyword in some positives (kws.synth.corpus.keyword_seconds cuts them)
    keyword_texts = (HI_TEXTS + HI_PINYIN, NIHAO_TEXTS + NIHAO_PINYIN)
    public_kinds = {
        "zh": "speech",
        "syl": "syllables",
        "en": "other_language",
        "yue": "other_language",
        "stream": "stream",
    }

    # confusables beside the hand-written ones (with_neighbours): drawn as often as each of them
    neighbours = ()

    def with_neighbours(self):
        """This profile, its near-misses also made as for any phrase (PhraseProfile: each syllable swapped
        for the nearest-sounding Hanzi of a different sound, not only tone; partial and reordered
        phrases): corpus.neighbours, for the training split."""
        made = PhraseProfile("cmn", [phrase for _, phrase, _, _ in BUILTIN["cmn"].values()]).text_confusables
        profile = MandarinDefault()
        profile.neighbours = tuple(t for t in made if t not in HARD_TEXTS)  # none holds a keyword (banned)
        return profile

    def banned(self, text):
        return _banned(text)

    def text(self, rng, kind, text_only=False):
        """(language, text) for one utterance of `kind` (every text here is plain text)."""
        if kind in ("hi", "nihao"):
            pinyin = rng.random() < 0.3
            if pinyin:
                return "cmn-latn-pinyin", rng.choice(HI_PINYIN if kind == "hi" else NIHAO_PINYIN)
            text = rng.choice(HI_TEXTS if kind == "hi" else NIHAO_TEXTS)
            if rng.random() < 0.25:  # keyword followed by a command
                text = text.rstrip("。！") + "，" + rng.choice(COMMANDS)
            return "cmn", text
        if kind == "hard":
            if rng.random() < 0.25:
                return "cmn-latn-pinyin", rng.choice(HARD_PINYIN)
            return "cmn", rng.choice(HARD_TEXTS + self.neighbours)
        if kind == "zh":
            return "cmn", _zh_sentence(rng)
        if kind == "yue":
            return "yue", _zh_sentence(rng)
        if kind == "syl":
            while True:
                lang, text = _syllables(rng)
                if not _banned(text) and "hao3 wen4 wen4" not in text and "xiao3 wen4" not in text:
                    return lang, text
        if kind == "en":
            return rng.choice(ENGLISH_ACCENTS), _english(rng)
        raise ValueError(kind)


# --- any phrase ------------------------------------------------------------------------------------
# Built-in phrases of the default corpus: given as a keyword (name or text), they keep their token and
# texts and add their hand-written near-misses to the confusables.
BUILTIN = {
    "cmn": {
        "hi_xiaowen": ("<HI_XIAOWEN>", "嗨小问", HI_TEXTS, HARD_TEXTS),
        "nihao_wenwen": ("<NIHAO_WENWEN>", "你好问问", NIHAO_TEXTS, HARD_TEXTS),
    },
}
DEFAULT_PHRASES = {"cmn": ("hi_xiaowen", "nihao_wenwen")}
MORE_ENGLISH_WORDS = (
    "hay",
    "hey",
    "way",
    "say",
    "day",
    "bay",
    "may",
    "pay",
    "ray",
    "stay",
    "key",
    "he",
    "hi",
    "high",
    "who",
    "how",
    "kiss",
    "kids",
    "quiz",
    "case",
    "cows",
    "keys",
    "calls",
    "codes",
    "kites",
    "cats",
    "quick",
    "queen",
    "west",
    "wes",
    "ace",
    "jay",
    "bee",
    "sea",
    "tea",
    "you",
    "yes",
    "okay",
    "hello",
    "yellow",
    "hollow",
    "lazy",
    "crazy",
    "nice",
    "price",
    "rice",
    "light",
    "night",
    "right",
    "write",
    "time",
    "nine",
    "fine",
    "line",
    "mine",
    "go",
    "no",
    "so",
    "show",
    "snow",
    "slow",
    "blue",
    "true",
    "new",
    "knew",
    "few",
    "view",
    "jar",
    "far",
    "star",
    "word",
    "world",
    "work",
    "walk",
    "talk",
    "wake",
    "make",
    "take",
    "bake",
    "lake",
    "cake",
    "sky",
    "buy",
    "guy",
)
# Phonetic neighbours of eSpeak's phoneme mnemonics (one feature apart: voicing, place, manner, or a
# neighbouring vowel); only those the language's own phoneme inventory holds are used.
PHONEME_NEIGHBOURS = {
    "p": "b t k f",
    "b": "p d g v m",
    "t": "d p k s T",
    "d": "t b g n D",
    "k": "g t p x",
    "g": "k d b N",
    "f": "v T s p",
    "v": "f D b w",
    "T": "D f s t",
    "D": "T v z d",
    "s": "z S T t",
    "z": "s Z D d",
    "S": "Z s tS",
    "Z": "S z dZ",
    "tS": "dZ S ts",
    "dZ": "tS Z",
    "h": "x f",
    "x": "h k",
    "X": "x h",
    "m": "n b",
    "n": "m N d l",
    "N": "n g",
    "l": "r n",
    "r": "l w",
    "w": "r v",
    "j": "l",
    "i": "I e i:",
    "I": "i E e",
    "e": "E I eI",
    "E": "e a I",
    "a": "E A V",
    "A": "a O V",
    "O": "o A V",
    "o": "O u oU",
    "U": "u o V",
    "u": "U o u:",
    "V": "a @ O",
    "@": "V 3 E",
    "3": "@ E",
    "eI": "aI E i:",
    "aI": "eI OI a",
    "OI": "aI oU",
    "aU": "oU a",
    "oU": "aU O u:",
    "i:": "I eI",
    "u:": "U oU",
    "A:": "a O:",
    "O:": "A: oU",
    "3:": "@ E",
}
VOWELS = frozenset(p for p in PHONEME_NEIGHBOURS if p[0] in "aeiouAEIOUV@3")
NUMBERS_PROBE = "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 20 30 40 50 60 70 80 90 100 1000 1000000"
OTHER_LANGUAGES = ("cmn", "en-us", "yue", "de", "fr", "es", "ru", "hi", "ja")
CJK = ("cmn", "yue", "ja")
_STRESS = "',"
_SPLIT = re.compile(r"[\s_,.!?;:，。！？、]+")
_LATIN = re.compile(r"^[a-zA-Z]+$")


def is_spelled(word):
    """A Latin word without a vowel, of at most 5 letters ("kws"): eSpeak NG, Flite and Festival say its
    letters one by one, and so the corpus's phonemes of it are the letters' names."""
    return bool(_LATIN.match(word)) and not re.search("[aeiouyAEIOUY]", word) and len(word) <= 5


def spell_out(text):
    """`text` with each spelled word written as its capital letters ("hey kws" -> "hey K W S"), for an
    engine that would otherwise read it as a word (SVOX Pico says "kws" as one syllable)."""
    return re.sub(r"[A-Za-z]+", lambda m: " ".join(m[0].upper()) if is_spelled(m[0]) else m[0], text)


def _is_letter(word):
    """A single Latin letter: a spelled word's letters swap only with letters, a word only with words (a
    CJK lexicon's entries are single characters, and words)."""
    return len(word) == 1 and bool(_LATIN.match(word))


def phrase_units(phrase, language):
    """The phrase's words; a CJK phrase without spaces: its characters."""
    words = [w for w in _SPLIT.split(phrase.strip()) if w]
    if len(words) == 1 and language.split("-")[0] in CJK and len(words[0]) > 1:
        return list(words[0])
    return words


def token_of(phrase):
    """`hey kws` -> `<HEY_KWS>`: words upper-cased and joined by `_`."""
    words = [w for w in _SPLIT.split(phrase.strip().strip("<>")) if w]
    if not words:
        raise KwsError(f"corpus.keywords: {phrase!r} has no word to make a keyword of")
    return "<" + "_".join(w.upper() for w in words) + ">"


def _normal(text):
    return re.sub(r"[\W_]+", "", text.lower())


# What a negative is, as data.list's `kind` records it (metrics break false alarms down by it).
UTTERANCE_KINDS = ("keyword", "partial", "near_miss", "speech", "syllables", "other_language", "stream")


def utterance_kind(profile, kind, text):
    """The data.list kind of a planned utterance: a confusable (`hard`) is `partial` when it is a
    contiguous part of a way the keyword is written (嗨小问 -> 小问, `hey kws` -> `hey`), else `near_miss`."""
    if kind in profile.positive:
        return "keyword"
    if kind == "hard":
        norm = _normal(text)
        whole = {_normal(t) for texts in profile.keyword_texts for t in texts}
        return "partial" if "[[" not in text and any(norm in t and norm != t for t in whole) else "near_miss"
    return profile.public_kinds[kind]


def spoken_keyword(profile, text):
    """The keyword as a positive's text says it: the text itself when it is the keyword alone, else the
    keyword before the speech said after it (嗨小问，打开电视 -> 嗨小问, `hey kws, what time is it` ->
    `hey kws`)."""
    written = sorted({t for texts in profile.keyword_texts for t in texts}, key=len, reverse=True)
    if text in written:
        return text
    for keyword in written:
        base = keyword.rstrip(".!。！")
        if text.startswith((base + "，", base + ", ")):
            return base
    return text


def base_phoneme(phoneme):
    """A mnemonic without stress marks and tone digits (`'ai55` -> `ai`)."""
    return phoneme.lstrip(_STRESS).rstrip("0123456789")


def phone_string(words):
    """eSpeak's phonemes (a list of words, each a list of mnemonics, kws.synth.espeak.Engine.phonemize)
    as the `phones` of data.list (kws.phones): space-separated, without stress marks and tone digits."""
    phones = (base_phoneme(p) for word in words for p in word if not p.startswith("("))  # (en): a switch
    return " ".join(p for p in phones if any(c.isalpha() or c == "@" for c in p))  # not a bare length mark


def phoneme_input_string(text, inventory):
    """eSpeak phoneme input (`[[h'eI k,eI]]`) as the `phones` of data.list, split into base phonemes by
    longest match against `inventory` (eSpeak does not read its own input notation back)."""
    longest = max((len(p) for p in inventory), default=1)
    phones = []
    for word in text.replace("[[", " ").replace("]]", " ").split():
        word, at = "".join(c for c in word if c not in "',"), 0
        while at < len(word):
            match = next((word[at : at + n] for n in range(longest, 0, -1) if word[at : at + n] in inventory), None)
            if match is None:
                at += 1  # a mark outside the inventory (length, syllable break): not a phoneme of its own
                continue
            phones.append(base_phoneme(match))
            at += len(match)
    return " ".join(phones)


def _distance(a, b):
    """Edit distance between phoneme lists (compared by base phoneme)."""
    a, b = [base_phoneme(p) for p in a], [base_phoneme(p) for p in b]
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def _espeak_languages():
    from pathlib import Path

    from kws.synth.espeak import _paths

    root = Path(_paths()[1]) / "lang"
    return sorted(p.name.lower() for p in root.rglob("*") if p.is_file())


def language_voices(language):
    """eSpeak's voices of a language's family (en-us -> en, en-us, en-gb-x-rp, ...), script variants
    (cmn-latn-pinyin, en-shaw) left out; the language itself first."""
    known = _espeak_languages()
    if language not in known:
        raise KwsError(f"corpus.language: eSpeak NG has no language {language!r} (e.g. cmn, en-us, de, fr)")
    family = language.split("-")[0]
    accents = [
        c
        for c in known
        if c.split("-")[0] == family
        and c != language
        and not any(len(tag) == 4 and tag.isalpha() for tag in c.split("-")[1:])
    ]
    return [language, *accents]


class PhraseProfile:
    """Keyword phrases of one language, with automatically made confusables and fillers."""

    kind_languages = None  # set per instance

    def __init__(self, language, keywords):
        from kws.synth.espeak import phonemize_batch

        self.language = language
        self.accents = language_voices(language)
        builtin = BUILTIN.get(language, {})
        aliases = {name: name for name in builtin} | {entry[1]: name for name, entry in builtin.items()}
        names = list(keywords) or list(DEFAULT_PHRASES.get(language, ()))
        if not names:
            raise KwsError(f"corpus.keywords: give the keyword phrases to synthesise in {language!r}")
        self.phrases, self.texts, hand_written, tokens = [], [], [], []
        for name in names:
            key = aliases.get(name.strip().lower().replace(" ", "_"), aliases.get(name.strip()))
            if key:
                token, phrase, texts, near = builtin[key]
                hand_written += near
            else:
                token, phrase = token_of(name), " ".join(name.split())
                texts = self._variants(phrase)
            if token in tokens or token == FILLER:
                raise KwsError(f"corpus.keywords: {name!r} gives the token {token}, which is already taken")
            tokens.append(token)
            self.phrases.append(phrase)
            self.texts.append(texts)
        self.tokens = tuple(tokens)
        self.positive = {f"kw{i}": token for i, token in enumerate(tokens)}
        self._keyword_norms = [_normal(p) for p in self.phrases]
        family = language.split("-")[0]
        self.lexicon = self._lexicon(family)
        units = [phrase_units(p, language) for p in self.phrases]
        queries = [(u, language) for us in units for u in us] + [(w, language) for w in self.lexicon]
        queries += [(NUMBERS_PROBE, language)] + [(p, language) for p in self.phrases]
        phonemes = phonemize_batch(queries)
        count = sum(len(us) for us in units)
        unit_ph = iter(phonemes[:count])
        lex_ph = dict(zip(self.lexicon, phonemes[count : count + len(self.lexicon)]))
        self.inventory = {base_phoneme(p) for words in phonemes for word in words for p in word}
        self._phrase_phonemes = phonemes[count + len(self.lexicon) + 1 :]
        confusables = set(hand_written)
        for phrase, us in zip(self.phrases, units):
            joiner = "" if family in CJK and " " not in phrase else " "
            ph = [sum(next(unit_ph), []) for _ in us]
            confusables |= self._partials(us, joiner) | self._reordered(us, joiner)
            confusables |= self._text_neighbours(us, ph, joiner, lex_ph)
        self.text_confusables = sorted(c for c in confusables if not self.banned(c))
        self.phoneme_confusables = sorted(self._phoneme_neighbours())
        if not self.text_confusables and not self.phoneme_confusables:
            raise KwsError(f"corpus.keywords: no confusable negative could be made for {self.phrases}")
        other = [lang for lang in OTHER_LANGUAGES if lang.split("-")[0] != family]
        self.other_languages = [lang for lang in other if lang in _espeak_languages()]
        self.kind_languages = {
            **{k: language for k in self.positive},
            "hard": language,
            "lang": language,
            "syl": language,
            "other": "other",
        }
        positives = 0.3 / len(tokens)
        self.kind_share = {
            **{k: positives for k in self.positive},
            "hard": 0.22,
            "lang": 0.24,
            "syl": 0.1,
            "other": 0.14,
        }
        self.stream_kind_share = {"lang": 0.55, "syl": 0.2, "other": 0.25}
        self.babble_kinds = ("lang", "lang", "other")
        self.keyword_texts = self.texts

    commands = ()
    public_kinds = {"lang": "speech", "syl": "syllables", "other": "other_language", "stream": "stream"}

    def with_neighbours(self):
        """Its confusables are made for every split already."""
        return self

    @staticmethod
    def _variants(phrase):
        words = phrase.split()
        out = [phrase, phrase + ".", phrase + "!", phrase[:1].upper() + phrase[1:]]
        if len(words) > 1:
            out.append(words[0] + ", " + " ".join(words[1:]))
        return tuple(out)

    @staticmethod
    def _lexicon(family):
        if family == "en":
            words = sorted(set(ENGLISH_WORDS) | set(MORE_ENGLISH_WORDS))
            return words + list("abcdefghijklmnopqrstuvwxyz")
        if family == "cmn":
            return list(dict.fromkeys(HANZI))
        return []

    @staticmethod
    def _partials(units, joiner):
        n = len(units)
        return {joiner.join(units[i:j]) for i in range(n) for j in range(i + 1, n + 1) if j - i < n}

    @staticmethod
    def _reordered(units, joiner):
        perms = itertools.islice(itertools.permutations(units), 1, 7)
        return {joiner.join(p) for p in perms if list(p) != units}

    def _text_neighbours(self, units, unit_phonemes, joiner, lex_ph):
        """Each word (a spelled word: each letter) swapped for the lexicon's nearest-sounding entries."""
        out = set()
        for i, (unit, ph) in enumerate(zip(units, unit_phonemes)):
            spelled = is_spelled(unit)
            parts = list(unit) if spelled and len(unit) > 1 else [unit]
            for k, part in enumerate(parts):
                target = sum(lex_ph[part], []) if part in lex_ph else ph
                limit = max(1, len(target) // 3)
                scored = sorted(
                    (_distance(target, sum(p, [])), word)
                    for word, p in lex_ph.items()
                    if word != part and _is_letter(word) == (len(part) == 1 and spelled)
                )
                for dist, word in scored[:6]:
                    if 1 <= dist <= limit:
                        new = "".join(parts[:k] + [word] + parts[k + 1 :]) if len(parts) > 1 else word
                        out.add(joiner.join(units[:i] + [new] + units[i + 1 :]))
        return out

    def _phoneme_neighbours(self):
        """Each phrase with one phoneme swapped for a neighbour, as eSpeak phoneme input. In a language
        that marks stress, only consonants and primary-stressed vowels are swapped: a reduced vowel's
        neighbour (the schwa of "double" for its /ʌ/) is heard as the keyword itself, and such negatives
        only contradict the positives (on "hey kws" they scored as high as the keyword: 0.71-0.81 on
        average against a median of 0.77)."""
        out = set()
        for words in self._phrase_phonemes:
            stress_marked = any(phoneme.startswith("'") for word in words for phoneme in word)
            for w, word in enumerate(words):
                for p, phoneme in enumerate(word):
                    base = base_phoneme(phoneme)
                    if stress_marked and base in VOWELS and not phoneme.startswith("'"):
                        continue
                    for other in PHONEME_NEIGHBOURS.get(base, "").split():
                        if other not in self.inventory:
                            continue
                        new = list(word)
                        new[p] = phoneme.replace(base, other, 1)
                        out.add("[[" + " ".join("".join(x) for x in words[:w] + [new] + words[w + 1 :]) + "]]")
        return out

    def banned(self, text):
        """A filler that holds a keyword would be a mislabelled positive."""
        norm = _normal(text)
        return any(k in norm for k in self._keyword_norms) if "[[" not in text else False

    def _in_language(self, rng):
        family = self.language.split("-")[0]
        if family == "en":
            return _english(rng)
        if family in ("cmn", "yue"):
            return _zh_sentence(rng)
        return _numbers(rng)

    def _pseudo(self, rng, text_only):
        family = self.language.split("-")[0]
        if family == "cmn":
            return _syllables(rng)
        if _LATIN.match("".join(self.phrases).replace(" ", "")) or text_only:
            return self.language, " ".join(_latin_word(rng) for _ in range(rng.randint(1, 4)))
        return self.language, "[[" + " ".join(self._phoneme_word(rng) for _ in range(rng.randint(1, 4))) + "]]"

    def _phoneme_word(self, rng):
        vowels = sorted(v for v in self.inventory if v in VOWELS)
        consonants = sorted(c for c in self.inventory if c in PHONEME_NEIGHBOURS and c not in vowels)
        return "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(1, 3)))

    def text(self, rng, kind, text_only=False):
        """(language, text) for one utterance of `kind`; text_only: no eSpeak phoneme input."""
        for _ in range(100):
            lang, text = self._draw(rng, kind, text_only)
            if kind in self.positive or not self.banned(text):
                return lang, text
        raise KwsError(f"corpus.keywords: could not make a {kind} filler without a keyword in it")

    def _draw(self, rng, kind, text_only):
        accent = rng.choice(self.accents)
        if kind in self.positive:
            text = rng.choice(self.texts[int(kind[2:])])
            if rng.random() < 0.2:  # keyword followed by more speech
                text = text.rstrip(".!。！") + ", " + self._in_language(rng)
            return accent, text
        if kind == "hard":
            use_phonemes = (
                self.phoneme_confusables and not text_only and (not self.text_confusables or rng.random() < 0.3)
            )
            return accent, rng.choice(self.phoneme_confusables if use_phonemes else self.text_confusables)
        if kind == "lang":
            return accent, self._in_language(rng)
        if kind == "syl":
            return self._pseudo(rng, text_only)
        if kind == "other":
            lang = rng.choice(self.other_languages)
            family = lang.split("-")[0]
            return lang, (
                _english(rng) if family == "en" else _zh_sentence(rng) if family in ("cmn", "yue") else _numbers(rng)
            )
        raise ValueError(kind)


def _numbers(rng):
    """Numbers, which eSpeak reads as words of any language it speaks."""
    return " ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(1, 4)))


def _latin_word(rng):
    onsets = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr", "bl", "kr")
    vowels = ("a", "e", "i", "o", "u", "ay", "ee", "oo", "ow")
    return "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(1, 3))) + rng.choice(
        ("", "", "n", "t", "s", "k")
    )


def make_profile(language="cmn", keywords=()):
    """The profile of a synthetic corpus: the Mandarin default for cmn with its default keywords."""
    if language == "cmn" and [k.strip().lower() for k in keywords] in ([], list(DEFAULT_PHRASES["cmn"])):
        return MandarinDefault()
    return PhraseProfile(language, keywords)


def keyword_names(language="cmn", keywords=()):
    """Keyword names (token without brackets, lower case) of a synthetic corpus, without eSpeak."""
    if language == "cmn" and [k.strip().lower() for k in keywords] in ([], list(DEFAULT_PHRASES["cmn"])):
        return list(DEFAULT_PHRASES["cmn"])
    builtin = BUILTIN.get(language, {})
    aliases = {entry[1]: name for name, entry in builtin.items()}
    names = [aliases.get(k.strip(), k) for k in keywords]
    return [keyword_slug(token_of(k)) for k in names]
