"""Batch augmentation on the training device (kws.batch_augment, dataset_conf.batch_augment)."""

import numpy as np
import pytest
import soundfile
import torch

from kws.batch_augment import BatchAugment, _talkers_mix, fast_fft_size, parse_conf, read_noise_bank
from kws.dataset import Featurizer, cv_dataset_conf
from kws.errors import KwsError

FBANK = {"num_mel_bins": 16, "frame_shift": 10, "frame_length": 25, "dither": 0.0}


def speech_batch(lengths, seed=0):
    """Random 'speech' on the int16 scale, zero past each length."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max(lengths), generator=g) * 3000
    for row, length in enumerate(lengths):
        x[row, length:] = 0
    return x, torch.tensor(lengths)


def run(settings, x, lengths, seed=1):
    return BatchAugment(parse_conf(settings))(x, lengths, np.random.default_rng(seed))


def snr_db(clean, noisy):
    return float(10 * torch.log10(clean.square().mean() / (noisy - clean).square().mean()))


def test_noise_is_added_at_the_drawn_snr_within_each_utterance_and_padding_stays_zero():
    x, lengths = speech_batch([16000, 11000, 6000])
    y = run({"gain_db": None, "reverb": None, "noise": {"p": 1.0, "snr_db": [12, 12]}}, x, lengths)
    for row, length in enumerate(lengths.tolist()):
        assert snr_db(x[row, :length], y[row, :length]) == pytest.approx(12.0, abs=0.01)
        assert torch.all(y[row, length:] == 0)
    assert torch.all(x == speech_batch([16000, 11000, 6000])[0])  # the input is left as it was


def test_gain_alone_scales_by_the_drawn_decibels():
    x, lengths = speech_batch([8000, 8000])
    y = run({"gain_db": [-6, -6], "reverb": None, "noise": None}, x, lengths)
    torch.testing.assert_close(y, x * 10 ** (-6 / 20))


def test_gain_alone_takes_its_short_path_to_the_same_numbers_as_the_full_one():
    """Gain alone skips the padding mask; with noise and rooms present but never drawn (p 0) the full path
    runs on the same draws: equal to the bit, padding zero, the int16 range kept."""
    x, lengths = speech_batch([16000, 9000, 300, 12000], seed=4)
    x[:, :50] = 30000.0
    for low, high in ((-30, 6), (3, 6)):
        for samples in (x, x.to(torch.int16)):
            short = run({"gain_db": [low, high], "noise": None, "reverb": None}, samples, lengths, seed=7)
            full = run({"gain_db": [low, high], "noise": {"p": 0.0}, "reverb": {"p": 0.0}}, samples, lengths, seed=7)
            assert torch.equal(short, full) and short.dtype == torch.float32
            assert all(torch.all(short[row, n:] == 0) for row, n in enumerate(lengths.tolist()))
    assert float(short.max()) == 32767.0  # +3 dB at least: clipped


def test_reverberation_decays_60_db_over_its_rt60_and_keeps_the_level():
    click = torch.zeros(1, 16000)
    click[0, 0] = 10000.0
    y = run({"gain_db": None, "noise": None, "reverb": {"p": 1.0, "rt60_s": [0.4, 0.4]}}, click, torch.tensor([16000]))
    energy = y[0].square()
    drop = 10 * torch.log10(energy[1500:1700].mean() / energy[1500 + 3200 : 1700 + 3200].mean())
    assert float(drop) == pytest.approx(30.0, abs=6.0)  # 0.2 s of a 0.4 s RT60: half of 60 dB
    assert float(energy.sum()) == pytest.approx(float(click.square().sum()), rel=1e-3)


@pytest.mark.parametrize("drr_db", [6.0, 0.0, -6.0])
def test_reverberation_tail_lies_the_drawn_ratio_below_the_direct_path(drr_db):
    click = torch.zeros(1, 16000)
    click[0, 0] = 10000.0
    reverb = {"p": 1.0, "rt60_s": [0.4, 0.4], "drr_db": [drr_db, drr_db]}
    y = run({"gain_db": None, "noise": None, "reverb": reverb}, click, torch.tensor([16000]))
    energy = y[0].square()
    assert float(10 * torch.log10(energy[0] / energy[1:].sum())) == pytest.approx(drr_db, abs=0.01)
    assert float(energy.sum()) == pytest.approx(float(click.square().sum()), rel=1e-3)  # the level is kept


def test_fast_fft_size_is_the_smallest_5_smooth_size_at_least_n():
    def smooth(m):
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        return m == 1

    for n in [1, 2, 7, 97, 1000, 4097, 76001, 80000, 131073]:
        size = fast_fft_size(n)
        assert size >= n and smooth(size)
        assert not any(smooth(m) for m in range(n, size))


def test_same_draws_same_result_and_each_draw_its_own_stream():
    x, lengths = speech_batch([9000, 7000, 5000, 3000])
    on = {"noise": {"p": 1.0}, "reverb": {"p": 1.0}}
    assert torch.equal(run(on, x, lengths, seed=3), run(on, x, lengths, seed=3))
    assert not torch.equal(run(on, x, lengths, seed=3), run(on, x, lengths, seed=4))
    # the noise drawn does not depend on whether the utterance was reverberated first
    noise = {"gain_db": [0, 0], "noise": {"p": 1.0, "snr_db": [60, 60], "colour": [0, 0]}}
    dry = run({**noise, "reverb": None}, x, lengths, seed=3) - x
    wet = run({**noise, "reverb": {"p": 1.0}}, x, lengths, seed=3)
    wet = wet - run({"gain_db": [0, 0], "noise": None, "reverb": {"p": 1.0}}, x, lengths, seed=3)
    added_dry, added_wet = dry / dry.norm(dim=1, keepdim=True), wet / wet.norm(dim=1, keepdim=True)
    assert torch.allclose(added_dry, added_wet, atol=1e-3)


def test_noise_bank_noise_is_drawn_from_the_listed_wavs(tmp_path):
    t = np.arange(16000) / 16000
    soundfile.write(tmp_path / "hum.wav", (0.3 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32), 16000)
    bank = tmp_path / "noise.list"
    bank.write_text("# a bank of one hum\nhum hum.wav\n")
    assert len(read_noise_bank(bank)) == 16000
    x = torch.zeros(1, 8000)
    x[0, ::2] = 1000.0  # a speech stand-in with power at 0 and 8 kHz only
    conf = {"gain_db": None, "reverb": None, "noise": {"p": 1.0, "snr_db": [0, 0], "bank": str(bank)}}
    added = run(conf, x, torch.tensor([8000]))[0] - x[0]
    spectrum = torch.fft.rfft(added).abs()
    assert int(spectrum.argmax()) == pytest.approx(500, abs=2)  # 1 kHz of the 16 kHz / 8000-point FFT


def tone(frequency, n, amplitude=3000.0):
    return amplitude * torch.sin(2 * torch.pi * frequency * torch.arange(n) / 16000)


def band_power(x, frequency, n):
    """Power of x's FFT bin nearest `frequency` (an n-point FFT of 16 kHz samples)."""
    return float(torch.fft.rfft(x, n=n).abs()[round(frequency * n / 16000)] ** 2)


BABBLE_ONLY = {"gain_db": None, "reverb": None, "noise": None}


def test_babble_mixes_in_the_batchs_negatives_at_the_drawn_snr_and_never_a_keyword():
    """Row 0 is a keyword (a 1 kHz tone), rows 1-3 negatives (300, 500, 700 Hz; whole periods in every
    length, so each tone stays in its FFT bin however it wraps around). With p 1 every row gets
    babble at exactly 6 dB below its speech, the padding stays zero, and no row hears the keyword's tone."""
    lengths = [16000, 12000, 8000, 16000]
    x = torch.stack(
        [torch.nn.functional.pad(tone(f, n), (0, 16000 - n)) for f, n in zip((1000, 300, 500, 700), lengths)]
    )
    talkers = np.array([False, True, True, True])
    conf = {**BABBLE_ONLY, "babble": {"p": 1.0, "snr_db": [6, 6], "talkers": [2, 2]}}
    y = BatchAugment(parse_conf(conf))(x, torch.tensor(lengths), np.random.default_rng(3), talkers)
    for row, n in enumerate(lengths):
        assert snr_db(x[row, :n], y[row, :n]) == pytest.approx(6.0, abs=0.01)
        assert torch.all(y[row, n:] == 0)
        added = y[row, :n] - x[row, :n]
        heard = {f: band_power(added, f, n) for f in (1000, 300, 500, 700)}
        assert heard[1000] < 1e-6 * max(heard.values())  # the keyword is nobody's babble
        assert heard[(1000, 300, 500, 700)[row]] < 1e-6 * max(heard.values())  # nor a row its own
    # off (absent) by default, and a run without it leaves the other draws as they were
    assert parse_conf({})["babble"] is None
    with_noise = {"gain_db": [-3, 3], "reverb": None, "noise": {"p": 1.0}}
    plain = run(with_noise, x, torch.tensor(lengths), seed=5)
    babble_p0 = BatchAugment(parse_conf({**with_noise, "babble": {"p": 0.0}}))(
        x, torch.tensor(lengths), np.random.default_rng(5), talkers
    )
    assert torch.equal(plain, babble_p0)


def test_babble_needs_another_negative_and_a_lone_negative_is_left_alone():
    x, lengths = speech_batch([8000, 8000])
    conf = {**BABBLE_ONLY, "babble": {"p": 1.0}}
    y = BatchAugment(parse_conf(conf))(x, lengths, np.random.default_rng(0), np.array([True, False]))
    assert torch.equal(y[0], x[0])  # its only possible talker is a keyword
    assert not torch.equal(y[1], x[1])  # the keyword row hears the negative


def test_babble_talkers_by_slices_on_a_cpu_equal_the_gathers_a_gpu_makes():
    x, lengths = speech_batch([9000, 300, 5000, 7000], seed=6)
    rng = np.random.default_rng(1)
    sources = rng.integers(0, 4, (3, 4))
    starts = (rng.random((3, 4)) * lengths.numpy()[sources]).astype(np.int64)
    weights = rng.uniform(0.5, 1.0, (3, 4)) * (np.arange(4) < np.array([[4], [1], [2]]))
    args = (x, sources, starts, weights, lengths, lengths.numpy(), 9000, torch.float32)
    sliced, gathered = _talkers_mix(*args, by_slices=True), _talkers_mix(*args, by_slices=False)
    assert torch.equal(sliced, gathered)
    source, start = int(sources[1, 0]), int(starts[1, 0])  # row 1: one talker, from its start, wrapped
    length = int(lengths[source])
    expected = x[source, (start + torch.arange(9000)) % length] * float(weights[1, 0])
    torch.testing.assert_close(sliced[1], expected)


def test_featurizer_takes_babble_talkers_from_the_negatives_only():
    """Whatever the keyword row says, the negatives' features stay the same; change a negative and the
    other negative, whose only possible talker it is, hears it."""
    x, lengths = speech_batch([8000, 7000, 6000], seed=2)
    conf = {"fbank_conf": FBANK, "batch_augment": {**BABBLE_ONLY, "babble": {"p": 1.0, "talkers": [1, 1]}}}

    def feats(samples):
        batch = (["k", "a", "b"], samples.round().to(torch.int16), lengths, torch.tensor([0, -1, -1]))
        return Featurizer(conf, seed=5)(batch, epoch=1, index=0)[1]

    before = feats(x)
    other_keyword, other_negative = x.clone(), x.clone()
    other_keyword[0] = speech_batch([8000], seed=9)[0][0]
    other_negative[1, :7000] = speech_batch([7000], seed=9)[0][0]
    assert torch.equal(feats(other_keyword)[1:], before[1:])
    changed = feats(other_negative)
    assert not torch.equal(changed[2], before[2])


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"babble": {"talkers": [0, 2]}}, "dataset_conf.batch_augment.babble.talkers: expected [low, high]"),
        ({"babble": {"talkers": [1.5, 2]}}, "dataset_conf.batch_augment.babble.talkers: expected [low, high] whole"),
        ({"babble": {"voices": 2}}, "dataset_conf.batch_augment.babble.voices: unknown key"),
        ({"babble": {"talkers": 3}}, "dataset_conf.batch_augment.babble.talkers: expected [low, high]"),
        ({"noise": {"snr": [1, 2]}}, "dataset_conf.batch_augment.noise.snr: unknown key"),
        ({"speed": [0.9, 1.1]}, "dataset_conf.batch_augment.speed: unknown key"),
        ({"gain_db": [6, -6]}, "dataset_conf.batch_augment.gain_db: expected [low, high]"),
        ({"reverb": {"p": 1.5}}, "dataset_conf.batch_augment.reverb.p: expected a probability"),
        ({"reverb": {"rt60_s": [0.1, 3]}}, "dataset_conf.batch_augment.reverb.rt60_s: expected [low, high]"),
        ({"reverb": {"drr_db": [3, -3]}}, "dataset_conf.batch_augment.reverb.drr_db: expected [low, high]"),
        ("yes", "dataset_conf.batch_augment: expected a mapping"),
    ],
)
def test_bad_settings_name_the_key(conf, message):
    with pytest.raises(KwsError, match=message.replace("[", r"\[")):
        parse_conf(conf)


def test_bad_noise_bank_names_the_file_and_line(tmp_path):
    bank = tmp_path / "noise.list"
    bank.write_text("missing.wav\n")
    with pytest.raises(KwsError, match=f"{bank}:1: .*missing.wav: audio file not found"):
        read_noise_bank(bank)


def test_featurizer_augments_training_batches_only():
    x, lengths = speech_batch([8000, 6000])
    batch = (["a", "b"], x.round().to(torch.int16), lengths, torch.tensor([0, -1]))
    conf = {"fbank_conf": FBANK, "batch_augment": {"noise": {"p": 1.0}, "reverb": {"p": 1.0}}}
    plain = Featurizer({"fbank_conf": FBANK})(batch, epoch=1, index=0)[1]
    augmented = [Featurizer(conf, seed=5)(batch, epoch=e, index=0)[1] for e in (1, 1, 2)]
    assert torch.equal(augmented[0], augmented[1]) and not torch.equal(augmented[0], augmented[2])
    assert not torch.equal(plain, augmented[0])
    assert "batch_augment" not in cv_dataset_conf(conf)
    assert torch.equal(Featurizer(cv_dataset_conf(conf))(batch, epoch=1, index=0)[1], plain)
