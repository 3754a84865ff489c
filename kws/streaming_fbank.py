"""Incremental fbank: the frames of `kws.features.compute_fbank` on a stream, chunk by chunk.

Kaldi fbank with `snip_edges=True` (torchaudio's default, used by `compute_fbank`) puts frame i on
samples [i * shift, i * shift + length), and every per-frame step (DC removal, pre-emphasis, window,
FFT, mel, log) looks at that frame only. So the frames of a stream are computed exactly by calling
`compute_fbank` itself on a window that covers whole frames and keeping the samples the next frame
still needs. There is no second fbank implementation (WeKws's C++ runtime had one, with a different
window than training); the number of frames depends only on the number of samples, as offline.
No random dither at inference: the exported settings' `dither_floor` (the training dither's
expected power, kws.features.inference_fbank) is added to every frame, as offline.

The frames agree with a whole-file `compute_fbank` to float rounding (about 1e-6 on log-mel values
of order 10: the batched FFT/matmul rounds differently for different frame counts).
"""

import numpy as np
import torch

from kws.features import compute_fbank, fbank_settings, frame_geometry

SAMPLE_RATE = 16000


class StreamingFbank:
    """Feed float samples in [-1, 1] with `accept`; get the fbank frames that became complete."""

    def __init__(self, fbank_conf, sample_rate=SAMPLE_RATE):
        self.conf = dict(fbank_settings(fbank_conf))
        self.conf["dither"] = 0.0
        self.num_mel_bins = int(self.conf["num_mel_bins"])
        self.frame_length, self.frame_shift = frame_geometry(self.conf, sample_rate)
        self.sample_rate = sample_rate
        self.reset()

    def reset(self):
        """Start a new stream."""
        self._buffer = np.zeros(0, dtype=np.float32)
        self.frames_emitted = 0
        self.samples_seen = 0

    def accept(self, samples):
        """Append samples; return the newly complete frames as a Tensor [n, num_mel_bins] (n may be 0)."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        self.samples_seen += samples.size
        buffer = np.concatenate((self._buffer, samples)) if self._buffer.size else samples
        if buffer.size < self.frame_length:
            self._buffer = buffer.copy()
            return torch.zeros(0, self.num_mel_bins)
        count = 1 + (buffer.size - self.frame_length) // self.frame_shift
        window = buffer[: (count - 1) * self.frame_shift + self.frame_length]
        frames = compute_fbank(window, self.conf, dither=0.0)
        self._buffer = buffer[count * self.frame_shift :].copy()
        self.frames_emitted += count
        return frames

    def frame_end_seconds(self, index):
        """Time (s) at which frame `index` ends: the earliest moment its audio is all there."""
        return (index * self.frame_shift + self.frame_length) / self.sample_rate
