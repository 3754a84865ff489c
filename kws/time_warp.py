"""Speaking-rhythm augmentation on the feature batch: each drawn training utterance's frames re-timed by
a random monotonic warp every epoch (`dataset_conf.time_warp`; issue 16).

Synthesisers differ in their duration models as much as in their timbre: one engine lengthens the last
syllable, another the vowels, a third says every syllable alike. The corpus varies the overall speaking
rate and the gaps between words when it synthesises; this varies the rhythm inside a phrase, and anew in
every epoch. The frames from the first up to an anchor are cut at `knots` random points into segments
whose durations are scaled by independent factors in [1 / (1 + stretch), 1 + stretch] and then rescaled
to the same total, and each output frame is read from the source time the warp maps it to (linear
interpolation between the two neighbouring frames). The anchor stays where it was: a keyword's recorded
end (kws.dataset.keyword_end_frames, which training_config.end_anchor rewards around), or the last frame
where none is known. Frames after the anchor and the padding are untouched, and the utterance keeps its
length, so labels, lengths and the phoneme targets stay valid.

    time_warp: {p: 0.5, knots: 3, stretch: 0.3}   # `time_warp: {}` takes these; absent or null: off

Draws come from the batch's generator (seed, epoch, rank, batch), so CPU runs stay bit-identical and a
resumed epoch repeats itself. Dev, scoring and the exports see the features as they are.
"""

import math

import numpy as np
import torch

from kws.device import to_device
from kws.errors import KwsError
from kws.mel_warp import numeric_settings

DEFAULTS = {"p": 0.5, "knots": 3, "stretch": 0.3}
WHERE = "dataset_conf.time_warp"


def parse_conf(conf):
    """The validated settings ({p, knots, stretch}), or None when `conf` is None (off)."""
    if conf is None:
        return None
    if not isinstance(conf, dict):
        raise KwsError(f"{WHERE}: expected a mapping such as {{p: 0.5, knots: 3, stretch: 0.3}}, got {conf!r}")
    unknown = sorted(set(conf) - set(DEFAULTS))
    if unknown:
        raise KwsError(f"{WHERE}.{unknown[0]}: unknown key (allowed: {', '.join(DEFAULTS)})")
    settings = numeric_settings(conf, DEFAULTS, WHERE)
    if settings["knots"] != int(settings["knots"]) or not 1 <= settings["knots"] <= 16:
        raise KwsError(f"{WHERE}.knots: expected a whole number from 1 to 16, got {settings['knots']!r}")
    if not 0 < settings["stretch"] <= 1:
        raise KwsError(f"{WHERE}.stretch: expected a number in (0, 1], got {settings['stretch']!r}")
    return {"p": float(settings["p"]), "knots": int(settings["knots"]), "stretch": float(settings["stretch"])}


def source_positions(anchor, knots, factors, cuts):
    """Source time (frames, float) of output frames 0..anchor under the warp whose segments between
    0, the cuts (fractions of the anchor, increasing) and the anchor last `factors` times as long (then all
    rescaled to the anchor): a piecewise-linear increasing map with 0 -> 0 and anchor -> anchor. anchor >= 1
    (TimeWarp warps anchors of at least 2 frames)."""
    source_knots = np.concatenate([[0.0], np.asarray(cuts, dtype=np.float64) * anchor, [float(anchor)]])
    durations = np.diff(source_knots) * np.asarray(factors, dtype=np.float64)
    output_knots = np.concatenate([[0.0], np.cumsum(durations) * (anchor / durations.sum())])
    output_knots[-1] = float(anchor)
    return np.interp(np.arange(anchor + 1, dtype=np.float64), output_knots, source_knots)


class TimeWarp:
    """feats [B, T, bins] -> feats with each utterance's frames up to its anchor re-timed with probability p.
    `anchors` maps a key to the frame that must stay put (a keyword's end); others anchor at their last
    frame."""

    def __init__(self, settings, anchors=None):
        self.p, self.knots, self.stretch = settings["p"], settings["knots"], settings["stretch"]
        self.anchors = dict(anchors or {})

    def __call__(self, feats, keys, frames, rng):
        """feats re-timed; `frames` [B]: each utterance's valid frames (host); `rng`: a numpy Generator whose
        draws are the same whatever the device."""
        batch, length, bins = feats.shape
        hits = rng.random(batch) < self.p
        limit = math.log1p(self.stretch)
        factors = np.exp(rng.uniform(-limit, limit, size=(batch, self.knots + 1)))
        cuts = np.sort(rng.random((batch, self.knots)), axis=1)
        rows, warps = [], []
        for row in np.flatnonzero(hits):
            last = int(frames[row]) - 1
            anchor = min(max(int(self.anchors.get(keys[row], last)), 0), last)
            if anchor >= 2:
                positions = np.arange(length, dtype=np.float64)
                positions[: anchor + 1] = source_positions(anchor, self.knots, factors[row], cuts[row])
                rows.append(row)
                warps.append(positions)
        if not rows:
            return feats
        positions = np.stack(warps)  # [rows, T]: the source time of each output frame
        left = np.clip(np.floor(positions).astype(np.int64), 0, length - 1)
        right = np.minimum(left + 1, length - 1)
        weight = to_device(positions - left, feats.device, feats.dtype)[:, :, None]
        left = to_device(left, feats.device)[:, :, None].expand(-1, -1, bins)
        right = to_device(right, feats.device)[:, :, None].expand(-1, -1, bins)
        index = to_device(np.asarray(rows), feats.device)
        chosen = feats[index]
        feats = feats.clone()
        feats[index] = torch.gather(chosen, 1, left) * (1 - weight) + torch.gather(chosen, 1, right) * weight
        return feats
