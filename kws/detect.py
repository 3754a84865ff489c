"""Streaming keyword detection with an exported model: `kws-detect MODEL AUDIO` (or `python -m kws.detect`).

MODEL is an export of `scripts/export_model.py`: `model.onnx` (run with onnxruntime) or the
TorchScript `model.pt`, chosen by suffix. AUDIO is a wav file (a recording at another rate or with several
channels is averaged to mono and resampled to 16 kHz, and a note on stderr says so), or `-` for raw 16 kHz
16-bit little-endian mono PCM on standard input (e.g. `arecord -f S16_LE -r 16000 -c 1 -t raw | kws-detect m.pt -`).

Audio is processed in chunks of --chunk-ms: fbank frames are computed incrementally
(`kws.streaming_fbank`, the same `compute_fbank` as training and scoring, with the
exported inference settings: no random dither, its expected power), the model runs on
the new frames carrying its cache, so the frame posteriors equal offline scoring of the whole file.
A model exported with the phoneme check (config score.phone_check) also outputs its phoneme head, and the
detector checks each keyword's posteriors with it as scoring did (kws.phone_check.PhoneCheck, carried across
chunks). A keyword is detected at the first frame whose posterior reaches its threshold; further frames of the
same keyword are ignored for --refractory seconds after a detection (each keyword separately).

Output, one line per detection: `keyword time_seconds score` (time = end of the detecting frame, i.e.
the moment the detector could know), or JSON lines with --json. Thresholds come from the model's
metadata (the DET operating point at 1 FA/h when the export had metrics, else 0.5);
`--threshold 0.6` sets all, `--threshold <HI_XIAOWEN>=0.7` (or `hi_xiaowen=0.7`) one keyword.
"""

import argparse
import json
import os
import sys

import numpy as np

from kws.errors import KwsError, cli
from kws.phone_check import PhoneCheck
from kws.streaming_fbank import StreamingFbank

DEFAULT_CHUNK_MS = 100
DEFAULT_REFRACTORY = 1.0


class Detector:
    """Feed audio with `accept(samples)`; returns the detections that the new audio completed.

    `runner` is a `kws.runners` runner (meta, init_cache(), run(feats, cache)). `thresholds` is a list
    with one threshold per keyword (index order). With `keep_posteriors`, `posteriors()` returns all
    frame posteriors so far [T, K].
    """

    def __init__(self, runner, thresholds=None, refractory=DEFAULT_REFRACTORY, keep_posteriors=False):
        self.runner = runner
        self.meta = runner.meta
        self.keywords = list(self.meta["keywords"])
        if thresholds is None:
            thresholds = [self.meta["thresholds"][kw] for kw in self.keywords]
        if len(thresholds) != len(self.keywords):
            raise KwsError(f"{len(thresholds)} thresholds for {len(self.keywords)} keywords")
        self.thresholds = np.asarray(thresholds, dtype=np.float64)
        if refractory < 0:
            raise KwsError(f"--refractory must be >= 0 seconds, got {refractory}")
        self.fbank = StreamingFbank(self.meta["fbank"], sample_rate=int(self.meta["fbank"].get("sample_rate", 16000)))
        if self.fbank.num_mel_bins != int(self.meta["input_dim"]):
            raise KwsError(f"model metadata: {self.fbank.num_mel_bins} mel bins but input_dim {self.meta['input_dim']}")
        frame_seconds = self.fbank.frame_shift / self.fbank.sample_rate
        self.refractory_frames = int(round(refractory / frame_seconds))
        self.keep_posteriors = keep_posteriors
        check = self.meta.get("phone_check")
        # as scoring had it; exports from before the window checked frame by frame
        self.check = PhoneCheck(check["labels"], check["alpha"], check.get("window", 1)) if check else None
        self.reset()

    def reset(self):
        """Start a new stream (zero cache, no audio, no past detections)."""
        self.fbank.reset()
        self.cache = self.runner.init_cache()
        self.frame = 0  # frames consumed so far
        self.last = np.full(len(self.keywords), -(1 << 62), dtype=np.int64)
        self._posteriors = []
        self.check_state = self.check.init_state() if self.check else None

    def accept(self, samples):
        """Process float samples in [-1, 1]; return a list of detection dicts (keyword, index, time, score, frame)."""
        feats = self.fbank.accept(samples)
        count = feats.shape[0]
        if count == 0:
            return []
        posteriors, self.cache = self.runner.run(feats.unsqueeze(0), self.cache)
        posteriors = np.asarray(posteriors)[0]
        if self.check is not None:  # the model's outputs after the posteriors: its phoneme head
            posteriors, self.check_state = self.check.apply(posteriors, self.check_state)
        if self.keep_posteriors:
            self._posteriors.append(posteriors.copy())
        detections = self.decide(posteriors, self.frame)
        self.frame += count
        return detections

    def decide(self, posteriors, first_frame):
        """Threshold + refractory decisions for frames first_frame.. of posteriors [n, K]."""
        above = posteriors >= self.thresholds
        if not above.any():
            return []
        detections = []
        for row in np.nonzero(above.any(axis=1))[0]:
            frame = first_frame + int(row)
            for k in np.nonzero(above[row])[0]:
                if frame - self.last[k] >= max(self.refractory_frames, 1):
                    self.last[k] = frame
                    detections.append(
                        {
                            "keyword": self.keywords[k],
                            "index": int(k),
                            "frame": frame,
                            "time": round(self.fbank.frame_end_seconds(frame), 3),
                            "score": float(posteriors[row, k]),
                        }
                    )
        return detections

    def posteriors(self):
        if not self._posteriors:
            return np.zeros((0, len(self.keywords)), dtype=np.float32)
        return np.concatenate(self._posteriors, axis=0)


def resolve_thresholds(meta, specs):
    """Thresholds per keyword (index order): metadata, then `--threshold` values (global, then KW=value)."""
    from kws.keywords import keyword_slug as slug

    keywords = list(meta["keywords"])
    values = {kw: float(meta.get("thresholds", {}).get(kw, 0.5)) for kw in keywords}
    lookup = {}
    for kw in keywords:
        lookup[kw] = kw
        lookup.setdefault(slug(kw), kw)
    global_value, per_keyword = None, {}
    for spec in specs or []:
        name, sep, value = spec.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise KwsError(f"--threshold {spec!r}: expected a number or KEYWORD=number") from None
        if not 0.0 <= number <= 1.0:
            raise KwsError(f"--threshold {spec!r}: thresholds are posteriors, between 0 and 1")
        if not sep:
            global_value = number
            continue
        kw = lookup.get(name) or lookup.get(slug(name))
        if kw is None:
            raise KwsError(f"--threshold {spec!r}: unknown keyword {name!r} (the model has {', '.join(keywords)})")
        per_keyword[kw] = number
    if global_value is not None:
        values = {kw: global_value for kw in keywords}
    values.update(per_keyword)
    return [values[kw] for kw in keywords]


def pcm_chunks(stream, chunk_samples):
    """Float32 chunks from raw 16-bit little-endian mono PCM read from a binary stream."""
    pending = b""
    first = True
    while True:
        data = stream.read(chunk_samples * 2)
        if not data:
            break
        if first and data[:4] == b"RIFF" and data[8:12] == b"WAVE":
            raise KwsError(
                "stdin: this is a WAV file, `-` expects raw 16-bit PCM; pass the file's path instead "
                "(or strip the header: `sox in.wav -t raw -r 16000 -e signed -b 16 -c 1 -`)"
            )
        first = False
        data = pending + data
        usable = len(data) - len(data) % 2
        pending = data[usable:]
        if usable:
            yield np.frombuffer(data[:usable], dtype="<i2").astype(np.float32) / 32768.0
    if pending:
        print("warning: stdin ended with an odd byte (half a sample); ignored", file=sys.stderr)


def read_recording(path, rate=16000):
    """(float32 mono samples in [-1, 1] at `rate`, what was converted or None) of a wav of any sample rate
    and channel count: channels averaged, the rate converted by torchaudio's band-limited sinc resampling.
    A phone records at 44.1 or 48 kHz, often in stereo; corpora stay strict (kws.audio), where a mixed
    format is usually a preparation mistake. Here, not in kws.audio, so that the rules that read corpora
    do not depend on it."""
    import soundfile

    from kws.audio import read_wav

    try:
        return read_wav(path, rate), None
    except KwsError as strict:
        try:  # read_wav found audio, but of another rate or channel count: convert it
            info = soundfile.info(str(path))
        except Exception:
            raise strict from None
        if info.samplerate == rate and info.channels == 1:
            raise
    samples, source_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    if samples.shape[0] == 0:
        raise KwsError(f"{path}: audio file is empty (0 samples)")
    converted, mono = [], samples[:, 0]
    if samples.shape[1] != 1:
        mono = samples.mean(axis=1)
        converted.append(f"{samples.shape[1]} channels averaged")
    if source_rate != rate:
        import torch
        import torchaudio.functional

        mono = torchaudio.functional.resample(torch.from_numpy(np.ascontiguousarray(mono)), source_rate, rate)
        mono = mono.numpy()
        converted.append(f"{source_rate} Hz resampled to {rate} Hz")
    return np.ascontiguousarray(mono, dtype=np.float32), ", ".join(converted)


def wav_chunks(path, chunk_samples, rate=16000):
    """Chunks of a wav at `rate` Hz mono; another rate or channel count is converted, with a note on stderr."""
    samples, converted = read_recording(path, rate)
    if converted:
        print(f"note: {path}: {converted}", file=sys.stderr)
    for start in range(0, samples.size, chunk_samples):
        yield samples[start : start + chunk_samples]


def format_detection(det, as_json):
    if as_json:
        return json.dumps(
            {"keyword": det["keyword"], "time": det["time"], "score": round(det["score"], 6), "frame": det["frame"]}
        )
    return f"{det['keyword']} {det['time']:.3f} {det['score']:.4f}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="kws-detect", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="exported model: model.onnx (onnxruntime) or model.pt (TorchScript)")
    parser.add_argument(
        "audio",
        help="a wav (another rate than 16 kHz or several channels are converted, with a note on stderr), "
        "or - for raw 16 kHz s16le mono PCM on stdin",
    )
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="[KW=]P",
        help="detection threshold: global (0.6) or per keyword (hi_xiaowen=0.6); repeatable",
    )
    parser.add_argument(
        "--refractory",
        type=float,
        default=DEFAULT_REFRACTORY,
        help=f"seconds a keyword stays silent after a detection (default {DEFAULT_REFRACTORY})",
    )
    parser.add_argument(
        "--chunk-ms",
        type=float,
        default=DEFAULT_CHUNK_MS,
        help=f"audio per processing step in ms (default {DEFAULT_CHUNK_MS})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of `keyword time score`")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for the model (default 1)")
    return parser.parse_args(argv)


@cli
def main(argv=None):
    from kws.runners import load_exported

    args = parse_args(argv)
    if not args.chunk_ms > 0:
        raise KwsError(f"--chunk-ms must be positive, got {args.chunk_ms}")
    if args.threads < 1:
        raise KwsError(f"--threads must be at least 1, got {args.threads}")
    runner = load_exported(args.model, threads=args.threads)
    detector = Detector(runner, resolve_thresholds(runner.meta, args.threshold), refractory=args.refractory)
    chunk_samples = max(1, int(round(detector.fbank.sample_rate * args.chunk_ms / 1000.0)))
    chunks = (
        pcm_chunks(sys.stdin.buffer, chunk_samples)
        if args.audio == "-"
        else wav_chunks(args.audio, chunk_samples, detector.fbank.sample_rate)
    )
    try:
        for chunk in chunks:
            for det in detector.accept(chunk):
                print(format_detection(det, args.json), flush=True)
    except BrokenPipeError:  # e.g. `kws-detect ... | head -1`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    main()
