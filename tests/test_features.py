"""kws.features: the batched fbank is Kaldi's fbank (torchaudio.compliance.kaldi) for every utterance of a
padded batch, and frame counts agree with it."""

import math

import pytest
import torch
import torchaudio.compliance.kaldi as kaldi

from kws.features import batch_fbank, cmvn_fbank, compute_fbank, feature_tag, inference_fbank, num_frames

CONFS = [
    {"num_mel_bins": 40, "frame_length": 25, "frame_shift": 10},
    {"num_mel_bins": 80, "frame_length": 32, "frame_shift": 12},
    {"num_mel_bins": 23, "frame_length": 20, "frame_shift": 10},
]


def kaldi_fbank(samples, conf):
    return kaldi.fbank(
        samples.reshape(1, -1) * 32768,
        num_mel_bins=conf["num_mel_bins"],
        frame_length=conf["frame_length"],
        frame_shift=conf["frame_shift"],
        dither=0.0,
        energy_floor=0.0,
        sample_frequency=16000,
    )


@pytest.mark.parametrize("conf", CONFS, ids=lambda c: f"{c['num_mel_bins']}bins")
def test_a_padded_batch_gives_each_utterance_its_kaldi_fbank(conf):
    generator = torch.Generator().manual_seed(0)
    lengths = [400, 401, 1234, 16000, 33333, 7]
    utterances = [(torch.rand(n, generator=generator) - 0.5) * 0.8 for n in lengths]
    utterances[3][2000:6000] = 0  # digital silence: the log floor
    batch = torch.nn.utils.rnn.pad_sequence(utterances, batch_first=True)
    feats, frames = batch_fbank(batch, torch.tensor(lengths), conf)
    for row, samples in enumerate(utterances):
        count = num_frames(len(samples), conf)
        assert int(frames[row]) == count
        if count == 0:
            assert torch.all(feats[row] == 0)
            continue
        expected = kaldi_fbank(samples, conf)
        assert expected.shape[0] == count
        torch.testing.assert_close(feats[row, :count], expected, rtol=0, atol=1e-4)
        assert torch.all(feats[row, count:] == 0)  # padding frames are zeros
        torch.testing.assert_close(compute_fbank(samples, conf, dither=0.0), expected, rtol=0, atol=1e-4)


def test_dither_is_seeded_and_small():
    conf = CONFS[0]
    samples = torch.rand(2, 8000, generator=torch.Generator().manual_seed(1)) - 0.5
    plain, _ = batch_fbank(samples, [8000, 8000], conf)
    a, _ = batch_fbank(samples, [8000, 8000], conf, dither=1.0, generator=torch.Generator().manual_seed(3))
    b, _ = batch_fbank(samples, [8000, 8000], conf, dither=1.0, generator=torch.Generator().manual_seed(3))
    c, _ = batch_fbank(samples, [8000, 8000], conf, dither=1.0, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 0 < float((a - plain).abs().max()) < 0.1  # 1 unit on the int16 scale barely moves speech


def test_inference_settings_replace_dither_by_its_expected_power():
    """A model trained with dither never saw a frame below the dither; at inference digital silence
    must look as it did in training (the mean power of dithered silence), not log(float eps)."""
    conf = {**CONFS[0], "dither": 1.0}
    settings = inference_fbank(conf)
    assert settings["dither"] == 0.0 and settings["dither_floor"] == 1.0
    assert inference_fbank({**conf, "dither_floor": 1.0})["dither_floor"] == pytest.approx(2**0.5)
    assert inference_fbank(CONFS[0])["dither_floor"] == 0.0  # no training dither: plain Kaldi fbank
    silence = torch.zeros(16000 * 20)
    plain = compute_fbank(silence, conf, dither=0.0)
    assert torch.allclose(plain, torch.full_like(plain, math.log(torch.finfo(torch.float32).eps)))
    dithered = compute_fbank(silence, conf, dither=1.0, generator=torch.Generator().manual_seed(5))
    floored = compute_fbank(silence, settings)
    assert torch.allclose(floored, floored[0].expand_as(floored))  # deterministic: the same every frame
    torch.testing.assert_close(floored[0], dithered.exp().mean(0).log(), rtol=0, atol=0.03)
    # speech-level audio is all but unchanged
    speech = (torch.rand(16000, generator=torch.Generator().manual_seed(6)) - 0.5) * 0.2
    assert float((compute_fbank(speech, settings) - compute_fbank(speech, conf, dither=0.0)).abs().max()) < 1e-3


def test_cmvn_and_its_folder_follow_the_inference_settings():
    settings = cmvn_fbank({"fbank_conf": {**CONFS[0], "dither": 1.0}})
    assert "dither" not in settings and settings["dither_floor"] == 1.0
    assert feature_tag(settings) == "fbank40_25ms_10ms_dither1"
    assert feature_tag(cmvn_fbank({"fbank_conf": CONFS[0]})) == "fbank40_25ms_10ms"
