"""In-process eSpeak NG (the `espeakng-loader` wheel) driven through ctypes, crash-isolated.

libespeak-ng keeps global state between utterances (wave-generator phase, echo buffer, ...), so the
same text, voice and random seed give different samples depending on what was spoken before, and a
few voice variants segfault on some texts. Both are handled by synthesising in a forked child of a
process whose engine has only been initialised: every batch starts from that same pristine state
(output depends only on the batch, never on which worker ran it or what it ran before), and a
segfault kills only the child. `synthesize_batch` then retries the crashed utterance alone with a
plain voice, and skips it (None) if that crashes too; the rest of the batch goes on in a new child.

The children are forked from a zygote: a process forked once, right after the engine's initialisation,
that does nothing but fork them. A child of the worker itself would inherit the worker's memory as its
past work left it, and eSpeak reads some of that: its number reading (`TranslateNumber_1`) uses entries of
a stack array of `TranslateClauseWithTerminator` that nothing wrote (valgrind), so a long number's speech
depended on which chunks, and which libraries' code, ran in that worker before.
"""

import atexit
import contextlib
import ctypes
import faulthandler
import math
import os
import pickle
import select
import signal
import struct
from pathlib import Path

from kws.errors import KwsError
from kws.synth.engine_base import environment

ESPEAK_RATE = 22050
# Variants measured to segfault libespeak-ng 1.52 on some texts with a high pitch range.
EXCLUDED_VARIANTS = frozenset({"Annie", "Demonic", "Henrique", "Hugo", "grandma", "rob", "robert", "shelby"})

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PHONEMES_IN_TEXT = 0x100  # espeakPHONEMES: `[[...]]` in the text is read as phoneme mnemonics
_PHONEME_SEPARATOR = ord("_") << 8  # espeak_TextToPhonemes: bits 8-23 hold the separator character
_PARAM = {"rate": 1, "volume": 2, "pitch": 3, "range": 4}
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
# A data folder for this process's engine instead of the wheel's (what with_variants makes): set by the
# synthesis for its workers, so that they can speak the variants it drew
DATA_ENV = "KWS_ESPEAK_DATA"


def _paths():
    try:
        import espeakng_loader
    except ImportError:
        raise KwsError("espeakng-loader is not installed (pip install espeakng-loader==0.2.4)") from None
    return espeakng_loader.get_library_path(), espeakng_loader.get_data_path()


def random_variant(rng):
    """The text of an eSpeak NG voice variant drawn from `rng` (a random.Random): a speaker that none of the
    shipped variants is. Its pitch, its formants' frequencies, strengths and widths, voicing, consonant
    strength, flutter and roughness are drawn; a fifth of the variants breathe, and a third use one of the
    Klatt synthesisers. Formants 1 and 2 (which tell the vowels apart) move together, as a vocal tract's
    length moves them, so that the vowel stays the one the text says; formants 3 to 5 and the low formant 0
    (the voice's quality, its speaker) move on their own."""
    base = math.exp(rng.uniform(math.log(70), math.log(210)))
    lines = ["language variant", "name kws_random", f"pitch {round(base)} {round(base * rng.uniform(1.3, 2.0))}"]
    tract = rng.uniform(0.86, 1.17)
    for n in range(9):
        if n in (1, 2):
            freq = tract * rng.uniform(0.95, 1.05)
        elif n in (0, 3, 4, 5):
            freq = rng.uniform(0.7, 1.25)
        else:
            freq = rng.uniform(0.85, 1.15)
        height = rng.uniform(0.0, 1.2) if n >= 6 else rng.uniform(0.6, 1.4)
        lines.append(f"formant {n} {round(100 * freq)} {round(100 * height)} {round(100 * rng.uniform(0.6, 1.6))}")
    lines.append(f"voicing {rng.randint(50, 170)}")
    lines.append(f"consonants {rng.randint(50, 130)} {rng.randint(50, 130)}")
    lines.append(f"flutter {rng.randint(0, 40)}")
    lines.append(f"roughness {rng.randint(0, 5)}")
    if rng.random() < 0.2:
        lines.append("breath " + " ".join(str(rng.randint(0, 40)) for _ in range(6)))
    if rng.random() < 0.33:
        lines.append(f"klatt {rng.randint(1, 6)}")
    return "\n".join(lines) + "\n"


# eSpeak NG lists at most 349 voices (N_VOICES_LIST); the wheel's languages and variants take 245 of them
MAX_LISTED_VOICES = 349


def with_variants(folder, variants):
    """An eSpeak NG data folder at `folder` (made, not yet existing) that is the wheel's, read through
    symbolic links, plus the variants {name: text} in voices/!v: what DATA_ENV points the workers at."""
    _, data = _paths()
    data, folder = Path(data), Path(folder)
    shipped = data / "voices" / "!v"
    for name in variants:
        if (shipped / name).exists() or "/" in name or not name:
            raise KwsError(f"eSpeak NG variant name {name!r} is taken or not a file name")
    listed = sum(path.is_file() for top in ("lang", "voices") for path in (data / top).rglob("*")) + len(variants)
    if listed > MAX_LISTED_VOICES:
        raise KwsError(f"{len(variants)} eSpeak NG variants are too many: it lists at most {MAX_LISTED_VOICES} voices")
    (folder / "voices" / "!v").mkdir(parents=True)
    # every entry linked but the folders on the way to voices/!v, which are made to hold the drawn files
    for source, target in ((data, folder), (data / "voices", folder / "voices"), (shipped, folder / "voices" / "!v")):
        for entry in source.iterdir():
            if not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)
    for name, text in variants.items():
        (folder / "voices" / "!v" / name).write_text(text)
    return folder


@contextlib.contextmanager
def speaking_variants(folder, variants, writable=False):
    """Within it, engines started (spawned synthesis workers) read the data folder with_variants(folder,
    variants) makes, so they speak those variants too; nothing changes without variants, unless
    `writable` (requests with a variant of their own write it there)."""
    if not variants and not writable:
        yield
        return
    with environment(**{DATA_ENV: str(with_variants(folder, variants))}):
        yield


def list_variants():
    """Voice variant names shipped with espeak-ng-data, sorted, without the crash-prone ones."""
    _, data = _paths()
    names = sorted(p.name for p in (Path(data) / "voices" / "!v").iterdir() if p.is_file())
    return [name for name in names if name not in EXCLUDED_VARIANTS and " " not in name]


class Engine:
    """One initialised libespeak-ng (per process). `speak(request)` returns int16 PCM bytes at 22.05 kHz."""

    def __init__(self):
        lib_path, data_path = _paths()
        self._own_data = os.environ.get(DATA_ENV)  # drawn voices' folder, where a request's own variant goes
        data_path = self._own_data or data_path
        lib = ctypes.CDLL(lib_path)
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        lib.espeak_ng_SetRandSeed.restype = None
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        # one slot per engine, which its forked children share: eSpeak stops finding voices past the 349 it
        # lists, so the slots must not pile up as the children come and go
        self._slot = f"kws-slot-{os.getpid()}"
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path.encode(), 0)
        if rate != ESPEAK_RATE:
            raise KwsError(f"{lib_path}: eSpeak NG initialisation failed (returned {rate})")
        self._lib = lib
        self._chunks = []
        self._callback = _CALLBACK(self._collect)  # keep a reference: the library holds the pointer
        lib.espeak_SetSynthCallback(self._callback)

    def _collect(self, wav, count, _events):
        if count > 0 and wav:
            self._chunks.append(ctypes.string_at(wav, 2 * count))
        return 0

    def speak(self, request):
        """request: dict with text, voice (e.g. `cmn+f3`), rate, pitch, range, volume, seed; and optionally
        variant, the text of a voice variant drawn for this request alone, which `voice` names."""
        lib = self._lib
        self._chunks = []
        voice = request["voice"]
        if "variant" in request:
            voice = self._own_variant(voice.split("+")[0], request["variant"])
        if lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise KwsError(f"eSpeak NG has no voice {request['voice']!r}")
        for name, code in _PARAM.items():
            if name in request:
                lib.espeak_SetParameter(code, int(request[name]), 0)
        lib.espeak_ng_SetRandSeed(int(request.get("seed", 1)))
        text = request["text"].encode("utf-8")
        # Only texts that hold phoneme input set the flag: every other text synthesises as it always did.
        flags = _CHARS_UTF8 | (_PHONEMES_IN_TEXT if "[[" in request["text"] else 0)
        status = lib.espeak_Synth(text, len(text) + 1, 0, _POS_CHARACTER, 0, flags, None, None)
        if status != 0:
            raise KwsError(f"eSpeak NG could not synthesise {request['text']!r} (status {status})")
        return b"".join(self._chunks)

    def _own_variant(self, language, text):
        """The voice `language+slot` after writing `text` to this process's slot in the data folder: eSpeak
        reads a variant's file each time a voice names it, so one slot speaks any number of drawn voices,
        beyond the 349 it can list."""
        if not self._own_data:
            raise KwsError(f"a drawn eSpeak NG variant needs a data folder of its own ({DATA_ENV}, speaking_variants)")
        (Path(self._own_data) / "voices" / "!v" / self._slot).write_text(text)
        return f"{language}+{self._slot}"

    def phonemize(self, text, voice):
        """eSpeak's phoneme mnemonics of `text` as a list of words, each a list of phonemes (stress
        marks kept on their phoneme), e.g. `hey` -> [["h", "'eI"]]."""
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise KwsError(f"eSpeak NG has no voice {voice!r}")
        pointer = ctypes.c_char_p(text.encode("utf-8"))
        clauses = []
        while pointer.value:
            result = self._lib.espeak_TextToPhonemes(ctypes.byref(pointer), _CHARS_UTF8, _PHONEME_SEPARATOR)
            clauses.append((result or b"").decode("utf-8", errors="replace"))
        words = " ".join(clauses).split()
        return [[p for p in word.split("_") if p and p != "|"] for word in words]


_ENGINE = None
_ZYGOTE = None


def engine():
    """This process's initialised engine; its zygote is forked from that state at once."""
    global _ENGINE, _ZYGOTE
    if _ENGINE is None:
        _ENGINE = Engine()
    if _ZYGOTE is None or _ZYGOTE.owner != os.getpid():  # a forked copy of a process gets its own
        if _ZYGOTE is not None:
            _ZYGOTE.release()  # the parent's pipes: holding them open would keep its zygote alive
        _ZYGOTE = _Zygote(_ENGINE)
    return _ENGINE


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd, size):
    data = bytearray()
    while len(data) < size:
        block = os.read(fd, size - len(data))
        if not block:
            raise EOFError(f"pipe closed after {len(data)} of {size} bytes")
        data += block
    return bytes(data)


class _Zygote:
    """A process forked right after the engine's initialisation that forks one child per batch.

    Pipes: control (a byte asks for a child; EOF ends the zygote), requests (the batch, read by the
    child), records (the child's results) and status (the child's exit code, sent by the zygote)."""

    def __init__(self, eng):
        self.owner = os.getpid()
        control_r, self.control = os.pipe()
        requests_r, self.requests = os.pipe()
        self.records, records_w = os.pipe()
        self.status, status_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            for fd in (self.control, self.requests, self.records, self.status):
                os.close(fd)
            _serve(eng, control_r, requests_r, records_w, status_w)
        for fd in (control_r, requests_r, records_w, status_w):
            os.close(fd)
        atexit.register(self.close)

    def run(self, requests):
        """(the bytes the child wrote, its exit code) for one batch."""
        payload = pickle.dumps(requests)
        _write_all(self.control, b"f")
        _write_all(self.requests, struct.pack("<Q", len(payload)) + payload)
        data = bytearray()
        while True:
            ready, _, _ = select.select([self.records, self.status], [], [])
            if self.records in ready:
                data += os.read(self.records, 1 << 20)
            elif self.status in ready:  # the child has exited: what it wrote is all in the pipe
                (code,) = struct.unpack("<i", _read_exactly(self.status, 4))
                os.set_blocking(self.records, False)
                try:
                    while block := os.read(self.records, 1 << 20):
                        data += block
                except BlockingIOError:
                    pass
                os.set_blocking(self.records, True)
                return bytes(data), code

    def release(self):
        """Close this process's ends of the pipes (the zygote sees EOF once no process holds them)."""
        for fd in (self.control, self.requests, self.records, self.status):
            os.close(fd)
        self.pid = None

    def close(self):
        if self.owner == os.getpid() and self.pid is not None:
            pid = self.pid
            self.release()
            os.waitpid(pid, 0)


def _serve(eng, control, requests, records, status):
    """The zygote's loop (never returns): a child per control byte, the child's exit code sent back."""
    code = 0
    try:
        while os.read(control, 1):
            pid = os.fork()
            if pid == 0:
                os.close(control)
                os.close(status)
                (size,) = struct.unpack("<Q", _read_exactly(requests, 8))
                _child(eng, pickle.loads(_read_exactly(requests, size)), records)
            _, child_status = os.waitpid(pid, 0)
            _write_all(status, struct.pack("<i", os.waitstatus_to_exitcode(child_status)))
    except BaseException:  # noqa: BLE001 - nothing may escape a forked process
        code = 3
    os._exit(code)


def fallback(request):
    """The retry for a request that crashed: same text and seed, base voice, default prosody."""
    plain = {key: value for key, value in request.items() if key not in ("rate", "pitch", "range", "variant")}
    plain["voice"] = request["voice"].split("+")[0]
    plain["fallback"] = True
    return plain


def _child(eng, requests, write_fd):
    """Runs in the forked child: speak each request, stream `<status><len><pcm>` records, _exit."""
    code = 0
    try:
        faulthandler.disable()  # a crash here is expected and handled by the parent: no tracebacks
        for request in requests:
            crash = request.get("_crash")  # fault injection for tests (kws.synth.faults): "once" or "always"
            if crash == "always" or (crash == "once" and not request.get("fallback")):
                os.kill(os.getpid(), signal.SIGSEGV)
            try:
                pcm, ok = eng.speak(request), 1
            except KwsError as err:
                pcm, ok = str(err).encode()[:2000], 0
            view = memoryview(struct.pack("<BI", ok, len(pcm)) + pcm)
            while view:
                view = view[os.write(write_fd, view) :]
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        code = 3
    os._exit(code)


def _run_forked(requests):
    """Speak requests in one child of the zygote. Returns (results, error): results for the completed prefix."""
    engine()
    data, exit_code = _ZYGOTE.run(requests)
    results, offset = [], 0
    while offset + 5 <= len(data):
        ok, size = struct.unpack_from("<BI", data, offset)
        if offset + 5 + size > len(data):
            break
        payload = bytes(data[offset + 5 : offset + 5 + size])
        if not ok:
            raise KwsError(payload.decode(errors="replace"))
        results.append(payload)
        offset += 5 + size
    if len(results) == len(requests) and exit_code == 0:
        return results, None
    return results, f"exit status {exit_code}"


def synthesize_batch(requests, log=None):
    """Speak a list of requests; returns one int16-PCM `bytes` (22.05 kHz) or None (skipped) each.

    Deterministic: the same batch always gives the same bytes, crashes included.
    """
    out = []
    rest = list(requests)
    while rest:
        results, error = _run_forked(rest)
        out.extend(results)
        rest = rest[len(results) :]
        if error is None:
            break
        crashed = rest.pop(0)
        retry, retry_error = _run_forked([fallback(crashed)])
        if log:
            log(
                f"eSpeak NG crashed ({error}) on {crashed['text']!r} with {crashed['voice']}; "
                + ("skipped" if retry_error else f"retried with {crashed['voice'].split('+')[0]}")
            )
        out.append(None if retry_error else retry[0])
    return out


def phonemize_batch(texts_and_voices):
    """[(text, voice), ...] -> eSpeak phonemes of each (see Engine.phonemize), computed in a forked child
    so that this process's engine stays as initialised (synthesis output depends on that state)."""
    import json

    eng = engine()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 0
        try:
            try:
                payload = {"ok": [eng.phonemize(text, voice) for text, voice in texts_and_voices]}
            except KwsError as err:
                payload = {"error": str(err)}
            view = memoryview(json.dumps(payload).encode())
            while view:
                view = view[os.write(write_fd, view) :]
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            code = 3
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not data:
        raise KwsError(f"eSpeak NG crashed while phonemizing {texts_and_voices[:1]!r}...")
    payload = json.loads(data)
    if "error" in payload:
        raise KwsError(payload["error"])
    return payload["ok"]
