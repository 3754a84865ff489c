"""The default corpus: "hi xiaowen" / "nihao wenwen" keywords and fillers, synthesised with eSpeak NG.

Plan (main process, from the seed) -> chunks of synthesis requests -> spawned worker processes
(each forks a pristine eSpeak child per chunk, see kws.synth.espeak) -> augmentation -> wavs.
Everything random comes from the seed and the item's position in the plan, so the output does not
depend on --threads or on scheduling. Splits are speaker-disjoint by eSpeak voice variant.
"""

import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from collections import deque
from fractions import Fraction
from multiprocessing.connection import wait
from pathlib import Path

from kws.errors import KwsError

SPLITS = ("train", "dev", "test")
KEYWORDS = ("<HI_XIAOWEN>", "<NIHAO_WENWEN>")
FILLER = "<FILLER>"
TOKEN = {"hi": KEYWORDS[0], "nihao": KEYWORDS[1]}
SAMPLE_RATE = 16000

# utterances per split, and seconds of long filler streams in test
SIZES = {
    "tiny": {"train": 24, "dev": 8, "test": 8, "stream_seconds": 20, "stream_length": (20, 25)},
    "small": {"train": 320, "dev": 60, "test": 80, "stream_seconds": 300, "stream_length": (20, 60)},
    "default": {"train": 9600, "dev": 300, "test": 400, "stream_seconds": 2700, "stream_length": (20, 60)},
    "large": {"train": 16000, "dev": 2000, "test": 2000, "stream_seconds": 3 * 3600, "stream_length": (20, 60)},
}
VOICE_SHARE = {"train": 0.7, "dev": 0.15, "test": 0.15}
# share of each utterance kind (positives ~30 %)
KIND_SHARE = {"hi": 0.15, "nihao": 0.15, "hard": 0.2, "zh": 0.22, "syl": 0.1, "en": 0.12, "yue": 0.06}
# No hard negatives in streams: back to back, partial keywords (嗨 + 小问问) can form a keyword.
STREAM_KIND_SHARE = {"zh": 0.45, "syl": 0.2, "en": 0.25, "yue": 0.1}
ENGLISH_ACCENTS = ("en-us", "en", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc", "en-gb-x-gbclan")
SPEEDS = (0.9, 0.95, 1.05, 1.1)  # speed perturbation factors of augmented utterances
CHUNK_REQUESTS = 24  # synthesis requests per worker job (fixed: the output must not depend on it varying)
BABBLE_SOURCES = 4  # filler syntheses per chunk mixed into babble noise
MAX_WORKER_DEATHS = 2  # a chunk whose worker process died this often is skipped

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
    "你好", "问问", "小问", "嗨", "你好问", "小问问", "嗨小", "好问问", "嗨小王", "嗨小吴",
    "你好呀", "你好啊问问", "问问你好", "小问嗨", "你好问题", "你好我问问", "你问问", "你好温暖", "你好问一下",
    "你好小问", "嗨问问", "嗨你好", "你好你好", "小问你好", "你好万万", "你好慢慢",
    "嗨小雨", "嗨小龙", "请问问他", "你好吗", "我问问",
)
HARD_PINYIN = (
    "ni3 hao3", "wen4 wen4", "xiao3 wen4", "hai1", "ni3 hao3 wen4", "xiao3 wen4 wen4", "hai1 xiao3 wang2",
    "ni3 hao3 wan4 wan4", "hai1 xiao3 yu3",
)
COMMANDS = (
    "今天天气怎么样", "播放音乐", "现在几点了", "打开灯", "关掉空调", "明天会下雨吗", "设置一个闹钟", "给妈妈打电话",
    "音量调大一点", "导航到公司", "讲个笑话", "下一首", "暂停", "打开电视",
)
SUBJECTS = ("我", "你", "他", "她", "我们", "你们", "他们", "老师", "妈妈", "爸爸", "小明", "同学们", "大家",
            "我的朋友", "医生", "这个人", "邻居", "老板", "孩子们", "司机")
TIMES = ("", "", "今天", "明天", "昨天", "现在", "晚上", "早上", "周末", "下午", "刚才", "每天")
PREDICATES = (
    "去超市买东西", "在家看电视", "想吃火锅", "要去上班", "在学校学习", "打电话给朋友", "听音乐", "看一本书",
    "坐地铁回家", "去公园散步", "做晚饭", "开会", "写作业", "玩游戏", "休息一下", "学习中文", "喝咖啡",
    "打扫房间", "去医院看病", "买了新手机", "坐飞机去北京", "在办公室加班", "跑步锻炼身体", "去银行取钱",
    "修理自行车", "准备考试", "在厨房洗碗", "看足球比赛", "去图书馆借书", "给孩子讲故事", "种了很多花",
    "在网上买衣服", "等公交车", "参加婚礼", "去海边旅游", "学习开车", "包饺子", "问问题", "写一封信",
)
PARTICLES = ("", "", "", "了", "吧", "吗", "呢", "啊")
QUESTIONS = COMMANDS + (
    "这个多少钱", "你叫什么名字", "我们什么时候出发", "请把门关上", "谢谢你的帮助", "没关系", "我不知道",
    "欢迎光临", "慢走", "祝你生日快乐", "新年快乐", "请稍等一下", "对不起我来晚了", "好久不见",
)
HANZI = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后"
    "小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长"
    "知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最"
    "间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市"
)
PINYIN_INITIALS = ("", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "zh", "ch", "sh",
                   "r", "z", "c", "s", "y", "w")
PINYIN_FINALS = ("a", "o", "e", "ai", "ei", "ao", "ou", "an", "en", "ang", "eng", "ong", "i", "u", "ia", "ie",
                 "iao", "iu", "ian", "in", "iang", "ing", "ua", "uo", "uai", "ui", "uan", "un", "uang")
ENGLISH = (
    "hey what time is it", "turn on the lights", "hi there", "hello", "how are you doing today",
    "set an alarm for seven", "play some music", "what's the weather like", "call my mother",
    "I'll be there in five minutes", "can you hear me", "thank you very much", "good morning everyone",
    "where did I put my keys", "let's go for a walk", "the meeting starts at ten", "open the window please",
    "I don't know", "see you tomorrow", "how much does it cost", "hey Siri", "okay Google", "Alexa, stop",
    "hi Sharon", "knee how", "nice to meet you", "when is the next train", "please stop the music",
    "turn the volume down", "what's for dinner tonight", "I really like this song", "excuse me",
    "happy birthday", "we need more milk", "it is raining again", "shall we start", "hello, when when",
)
ENGLISH_WORDS = ("the", "a", "cat", "dog", "car", "red", "big", "small", "house", "walk", "run", "today",
                 "morning", "light", "music", "phone", "water", "coffee", "please", "now", "later", "when",
                 "where", "shower", "how", "high", "hi", "window", "show", "new", "one", "two", "three")


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
    syl = [rng.choice(PINYIN_INITIALS) + rng.choice(PINYIN_FINALS) + str(rng.randint(1, 5))
           for _ in range(rng.randint(2, 7))]
    return "cmn-latn-pinyin", " ".join(syl)


def _text(rng, kind):
    """(language, text) for one utterance of `kind`."""
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
        return "cmn", rng.choice(HARD_TEXTS)
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


def _request(rng, kind, variants):
    lang, text = _text(rng, kind)
    variant = rng.choice(variants)
    slow = lang.startswith("cmn") or lang == "yue"
    return {
        "text": text,
        "voice": f"{lang}+{variant}" if variant else lang,
        "rate": rng.randint(110, 210) if slow else rng.randint(130, 240),
        "pitch": rng.randint(15, 85),
        "range": rng.randint(10, 90),
        "volume": 60,
        "seed": rng.randint(1, 2**31 - 1),
    }


def _counts(total, shares):
    """Largest-remainder allocation of `total` over `shares`, at least one of each keyword."""
    raw = {kind: total * share / sum(shares.values()) for kind, share in shares.items()}
    counts = {kind: int(value) for kind, value in raw.items()}
    for kind in sorted(raw, key=lambda k: counts[k] - raw[k])[:total - sum(counts.values())]:
        counts[kind] += 1
    for kind in ("hi", "nihao"):
        if kind in counts and counts[kind] == 0 and total >= 4:
            donor = max(counts, key=counts.get)
            counts[donor] -= 1
            counts[kind] += 1
    return counts


def split_voices(seed):
    """Voice variants (speakers) per split, disjoint; train also gets each language's default voice."""
    from kws.synth.espeak import list_variants

    variants = list_variants()
    random.Random(f"voices-{seed}").shuffle(variants)
    n_dev = max(2, round(len(variants) * VOICE_SHARE["dev"]))
    n_test = max(2, round(len(variants) * VOICE_SHARE["test"]))
    return {
        "train": [""] + sorted(variants[n_dev + n_test:]),
        "dev": sorted(variants[:n_dev]),
        "test": sorted(variants[n_dev:n_dev + n_test]),
    }


def plan_corpus(size, seed, augment=True, train_utterances=None):
    """The full, deterministic plan: a list of items (dicts) per split.

    train_utterances: the training split's size instead of the size's own; dev and test stay as they are
    (each split is drawn from its own random stream).
    """
    if size not in SIZES:
        raise KwsError(f"--size {size!r}: choose one of {', '.join(SIZES)}")
    spec = dict(SIZES[size])
    if train_utterances is not None:
        if train_utterances < 4:
            raise KwsError(f"--train-utterances {train_utterances}: must be at least 4")
        spec["train"] = train_utterances
    voices = split_voices(seed)
    plan = {}
    for split_index, split in enumerate(SPLITS):
        rng = random.Random(f"plan-{seed}-{split}")
        kinds = [kind for kind, n in _counts(spec[split], KIND_SHARE).items() for _ in range(n)]
        rng.shuffle(kinds)
        items = []
        for index, kind in enumerate(kinds):
            items.append({
                "key": f"syn_{split}_{index:06d}_{kind}", "split": split, "kind": kind,
                "token": TOKEN.get(kind, FILLER), "seed": [seed, split_index, index],
                "requests": [_request(rng, kind, voices[split])],
            })
        if split == "test":
            low, high = spec["stream_length"]
            total, index = 0.0, len(items)
            stream_kinds = list(STREAM_KIND_SHARE)
            weights = list(STREAM_KIND_SHARE.values())
            while total < spec["stream_seconds"]:
                length = round(rng.uniform(low, high), 2)
                n_segments = int(length / 2.2) + 3  # spare segments; the stream is cut at `length`
                items.append({
                    "key": f"syn_{split}_{index:06d}_stream", "split": split, "kind": "stream",
                    "token": FILLER, "seed": [seed, split_index, index], "length": length,
                    "requests": [_request(rng, rng.choices(stream_kinds, weights)[0], voices[split])
                                 for _ in range(n_segments)],
                })
                total += length
                index += 1
        for item in items:
            if item["token"] == FILLER:
                assert not any(_banned(r["text"]) for r in item["requests"]), item
        plan[split] = items
    return plan, voices


def make_chunks(plan, seed, augment=True):
    """Group items into worker jobs of about CHUNK_REQUESTS syntheses (+ babble sources), per split."""
    chunks = []
    for split in SPLITS:
        current, load, index = [], 0, 0
        for item in plan[split] + [None]:
            if current and (item is None or load + len(item["requests"]) > CHUNK_REQUESTS):
                chunks.append({"id": len(chunks), "split_index": index, "items": current})
                index += 1
                current, load = [], 0
            if item is not None:
                current.append(item)
                load += len(item["requests"])
    voices = split_voices(seed)
    for chunk in chunks:
        split = chunk["items"][0]["split"]
        # Seeded within the split: a split's audio must not depend on the sizes of the splits before it.
        rng = random.Random(f"babble-{seed}-{split}-{chunk['split_index']}")
        chunk["babble"] = ([_request(rng, rng.choice(("zh", "zh", "en", "yue")), voices[split])
                            for _ in range(BABBLE_SOURCES)] if augment else [])
    return chunks


# --- rendering (runs in the worker processes) ------------------------------------------------------
def _to_16k(pcm, speed=1.0):
    from kws.synth import augment as aug
    from kws.synth.espeak import ESPEAK_RATE

    x = aug.pcm16_to_float(pcm)
    x = aug.trim_silence(x, ESPEAK_RATE)
    return aug.resample(x, Fraction(ESPEAK_RATE) * Fraction(str(speed)), SAMPLE_RATE)


def _noise_and_reverb(x, rng, speech_rms, babble, snr_range, p_reverb, p_noise):
    from kws.synth import augment as aug

    if rng.random() < p_reverb:
        x = aug.reverberate(x, rng, SAMPLE_RATE, rt60=rng.uniform(0.15, 0.8))
    if rng.random() < p_noise:
        kind = rng.choice(aug.NOISE_TYPES, p=[0.15, 0.25, 0.15, 0.1, 0.35])
        noise = aug.make_noise(rng, kind, len(x), SAMPLE_RATE, babble)
        x = aug.add_noise(x, noise, rng.uniform(*snr_range), speech_rms)
    return x


def _clean_and_speed(rng, augment):
    """The first draws of an utterance's generator: left clean?, and its speed factor (< 1 is slower)."""
    clean = not augment or rng.random() < 0.15
    speed = 1.0 if clean or rng.random() < 0.5 else float(rng.choice(SPEEDS))
    return clean, speed


def _render_utterance(item, pcm, augment, babble):
    import numpy as np

    from kws.synth import augment as aug

    rng = np.random.default_rng(item["seed"])
    clean, speed = _clean_and_speed(rng, augment)
    x = _to_16k(pcm, speed)
    if len(x) == 0:
        return None
    level = -24.0 if not augment else rng.uniform(-34, -16)
    x = aug.set_level(x, level)
    speech_rms = aug.rms(x)
    lead, trail = (0.1, 0.1) if not augment else (rng.uniform(0.05, 1.0), rng.uniform(0.05, 0.8))
    x = np.concatenate([np.zeros(int(lead * SAMPLE_RATE), np.float32), x,
                        np.zeros(int(trail * SAMPLE_RATE), np.float32)])
    if not clean:
        x = _noise_and_reverb(x, rng, speech_rms, babble, (0.0, 25.0), p_reverb=0.35, p_noise=0.85)
    elif augment:  # even "clean" items get a faint noise floor instead of digital silence
        x = aug.add_noise(x, rng.standard_normal(len(x)).astype(np.float32), rng.uniform(40, 60), speech_rms)
    return aug.limit_peak(x)


def _render_stream(item, pcms, augment, babble):
    import numpy as np

    from kws.synth import augment as aug

    rng = np.random.default_rng(item["seed"])
    total = int(item["length"] * SAMPLE_RATE)
    parts, filled, levels = [], 0, []
    for pcm in pcms:
        if filled >= total:
            break
        gap = np.zeros(int((rng.uniform(0.2, 2.0) if augment else 0.5) * SAMPLE_RATE), np.float32)
        if pcm is None:
            continue
        x = _to_16k(pcm)
        if len(x) == 0:
            continue
        x = aug.set_level(x, rng.uniform(-34, -16) if augment else -24.0)
        levels.append(aug.rms(x))
        parts += [gap, x]
        filled += len(gap) + len(x)
    x = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if len(x) < total:
        x = np.concatenate([x, np.zeros(total - len(x), np.float32)])
    x = x[:total].copy()
    fade = min(160, total)
    x[-fade:] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
    if augment:
        speech_rms = float(np.median(levels)) if levels else 10 ** (-24 / 20)
        x = _noise_and_reverb(x, rng, speech_rms, babble, (5.0, 25.0), p_reverb=0.3, p_noise=0.9)
    return aug.limit_peak(x)


def render_chunk(chunk, tmp_root, augment, log=None):
    """Synthesise and write one chunk's wavs under tmp_root/wav/<split>/. Returns records."""
    from kws.audio import write_wav
    from kws.synth.espeak import synthesize_batch

    requests = [r for item in chunk["items"] for r in item["requests"]] + chunk["babble"]
    pcms = synthesize_batch(requests, log=log)
    babble_pcm = pcms[len(pcms) - len(chunk["babble"]):] if chunk["babble"] else []
    babble = [_to_16k(p) for p in babble_pcm if p is not None]
    records, offset = [], 0
    for item in chunk["items"]:
        mine = pcms[offset:offset + len(item["requests"])]
        offset += len(item["requests"])
        if item["kind"] == "stream":
            audio = _render_stream(item, mine, augment, babble)
        else:
            audio = None if mine[0] is None else _render_utterance(item, mine[0], augment, babble)
        if audio is None or len(audio) == 0:
            records.append({"key": item["key"], "split": item["split"], "skipped": True})
            continue
        write_wav(Path(tmp_root) / "wav" / item["split"] / f"{item['key']}.wav", audio, SAMPLE_RATE)
        records.append({"key": item["key"], "split": item["split"], "token": item["token"],
                        "kind": item["kind"], "seconds": len(audio) / SAMPLE_RATE,
                        "voice": item["requests"][0]["voice"] if item["kind"] != "stream" else "mixed"})
    return records


def _worker_main(conn, tmp_root, augment):
    from kws.synth.espeak import engine

    engine()  # initialise once; every chunk forks from this state
    while True:
        job = conn.recv()
        if job is None:
            break
        chunk, attempt = job
        if attempt == 0 and chunk.get("_kill_worker"):  # fault injection for tests
            os._exit(9)
        warnings = []
        records = render_chunk(chunk, tmp_root, augment, lambda message: warnings.append(f"warning: {message}"))
        conn.send((chunk["id"], records, warnings))
    conn.close()


def keyword_seconds(size="default", seed=666, split="test", augment=True):
    """Seconds of speech of the keyword in each positive utterance of `split`, as rendered.

    The keyword alone: leading/trailing silence and a command said after it are left out, the speed
    perturbation is the item's own. A model whose receptive field is shorter than a keyword only ever
    sees that keyword in part (compare with kws.model.receptive_field).
    """
    import numpy as np

    from kws.synth.espeak import synthesize_batch

    plan, _ = plan_corpus(size, seed, augment)
    requests, speeds = [], []
    for item in plan[split]:
        if item["token"] == FILLER:
            continue
        request = dict(item["requests"][0])
        for command in COMMANDS:  # "<keyword>，<command>": keep the keyword
            if request["text"].endswith("，" + command):
                request["text"] = request["text"][:-len(command) - 1]
        requests.append(request)
        speeds.append(_clean_and_speed(np.random.default_rng(item["seed"]), augment)[1])
    pcms = synthesize_batch(requests)
    return [len(_to_16k(pcm, speed)) / SAMPLE_RATE for pcm, speed in zip(pcms, speeds) if pcm is not None]


# --- orchestration ---------------------------------------------------------------------------------
class _Pool:
    """Spawned workers fed one chunk at a time; a worker that dies is replaced and its chunk retried."""

    def __init__(self, threads, tmp_root, augment, log):
        self.ctx = multiprocessing.get_context("spawn")
        self.threads, self.tmp_root, self.augment, self.log = threads, str(tmp_root), augment, log
        self.workers = []

    def _start(self):
        parent, child = self.ctx.Pipe()
        saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        os.environ.update({k: "1" for k in saved})
        try:
            proc = self.ctx.Process(target=_worker_main, args=(child, self.tmp_root, self.augment), daemon=True)
            proc.start()
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        child.close()
        worker = {"proc": proc, "conn": parent, "job": None}
        self.workers.append(worker)
        return worker

    def run(self, chunks):
        pending = deque((chunk, 0) for chunk in chunks)
        results = {}
        try:
            while pending or any(w["job"] for w in self.workers):
                while pending and len(self.workers) < min(self.threads, len(chunks)):
                    self._start()
                for worker in self.workers:
                    if worker["job"] is None and pending:
                        worker["job"] = pending.popleft()
                        worker["conn"].send(worker["job"])
                busy = [w for w in self.workers if w["job"] is not None]
                ready = wait([w["conn"] for w in busy] + [w["proc"].sentinel for w in busy])
                for worker in busy:
                    if worker["conn"] in ready:
                        try:
                            chunk_id, records, warnings = worker["conn"].recv()
                        except (EOFError, OSError):
                            self._died(worker, pending, results)
                            continue
                        for message in warnings:
                            self.log(message)
                        results[chunk_id] = records
                        worker["job"] = None
                    elif worker["proc"].sentinel in ready:
                        self._died(worker, pending, results)
        finally:
            self.close()
        return [results[chunk["id"]] for chunk in chunks]

    def _died(self, worker, pending, results):
        chunk, attempt = worker["job"]
        worker["proc"].join()
        code = worker["proc"].exitcode
        self.workers.remove(worker)
        worker["conn"].close()
        if attempt + 1 < MAX_WORKER_DEATHS:
            self.log(f"warning: synthesis worker died (exit {code}) on chunk {chunk['id']}; retrying it")
            pending.appendleft((chunk, attempt + 1))
        else:
            self.log(f"warning: synthesis worker died (exit {code}) on chunk {chunk['id']} again; "
                     f"skipping its {len(chunk['items'])} items")
            results[chunk["id"]] = [{"key": i["key"], "split": i["split"], "skipped": True} for i in chunk["items"]]

    def close(self):
        for worker in self.workers:
            try:
                worker["conn"].send(None)
            except (BrokenPipeError, OSError):
                pass
        for worker in self.workers:
            worker["proc"].join(timeout=10)
            if worker["proc"].is_alive():
                worker["proc"].kill()
                worker["proc"].join()
            worker["conn"].close()
        self.workers = []


def synthesize_corpus(out_dir, size="default", seed=666, threads=2, augment=True, log=None, _faults=None,
                      train_utterances=None):
    """Build the corpus under out_dir; returns a summary dict.

    _faults (tests): {"crash": {key: "once"|"always"}, "kill_worker": {key, ...}}.
    """
    from kws.datalist import write_dictionary
    from kws.fileio import atomic_open, ensure_dir

    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    if threads < 1:
        raise KwsError(f"--threads {threads}: must be at least 1")
    started = time.monotonic()
    plan, voices = plan_corpus(size, seed, augment, train_utterances)
    chunks = make_chunks(plan, seed, augment)
    faults = _faults or {}
    for chunk in chunks:
        for item in chunk["items"]:
            if item["key"] in faults.get("crash", {}):
                item["requests"][0]["_crash"] = faults["crash"][item["key"]]
            if item["key"] in faults.get("kill_worker", ()):
                chunk["_kill_worker"] = True

    out_text = str(out_dir).rstrip("/") or "/"
    out = ensure_dir(Path(out_text))
    tmp_root = Path(tempfile.mkdtemp(prefix=".synth-tmp-", dir=out))
    try:
        for split in SPLITS:
            (tmp_root / "wav" / split).mkdir(parents=True)
        records = [r for chunk_records in _Pool(threads, tmp_root, augment, log).run(chunks)
                   for r in chunk_records]
        by_split = {split: sorted((r for r in records if r["split"] == split and not r.get("skipped")),
                                  key=lambda r: r["key"]) for split in SPLITS}
        skipped = [r["key"] for r in records if r.get("skipped")]
        for split in SPLITS:
            if not by_split[split]:
                raise KwsError(f"{out_text}: no utterance of the {split} split could be synthesised")
        # commit: stale lists first, then the audio, then the lists (a reader sees all or nothing)
        for split in SPLITS:
            for name in ("wav.scp", "text", "wav.dur", "data.list"):
                (out / split / name).unlink(missing_ok=True)
        (out / "dict" / "words.txt").unlink(missing_ok=True)
        ensure_dir(out / "wav")
        for split in SPLITS:
            final = out / "wav" / split
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp_root / "wav" / split, final)
        summary = _summary(by_split, skipped, voices, size, seed, augment)
        with atomic_open(out / "synth_info.json") as handle:
            json.dump(summary, handle, indent=1, ensure_ascii=False, sort_keys=True)
            handle.write("\n")
        write_dictionary(out / "dict" / "words.txt", list(KEYWORDS), filler=FILLER)
        for split in SPLITS:
            with atomic_open(out / split / "text") as handle:
                handle.writelines(f"{r['key']} {r['token']}\n" for r in by_split[split])
            with atomic_open(out / split / "wav.scp") as handle:
                handle.writelines(f"{r['key']} {os.path.join(out_text, 'wav', split, r['key'] + '.wav')}\n"
                                  for r in by_split[split])
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    summary["seconds_taken"] = round(time.monotonic() - started, 1)
    return summary


def _summary(by_split, skipped, voices, size, seed, augment):
    splits = {}
    for split, records in by_split.items():
        filler = [r for r in records if r["token"] == FILLER]
        splits[split] = {
            "utterances": len(records),
            "hours": round(sum(r["seconds"] for r in records) / 3600, 4),
            "filler_hours": round(sum(r["seconds"] for r in filler) / 3600, 4),
            "streams": sum(r["kind"] == "stream" for r in records),
            "keywords": {token: sum(r["token"] == token for r in records) for token in KEYWORDS},
            "fillers": len(filler),
            "voices": voices[split],
        }
    return {"size": size, "seed": seed, "augment": augment, "splits": splits, "skipped": skipped}


def summary_line(summary):
    parts = [f"{split} {s['utterances']} utts {s['hours']:.2f} h (filler {s['filler_hours']:.2f} h)"
             for split, s in summary["splits"].items()]
    skipped = f", {len(summary['skipped'])} skipped" if summary["skipped"] else ""
    return f"synthesised {'; '.join(parts)}{skipped} in {summary.get('seconds_taken', 0):.1f} s"
