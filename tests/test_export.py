"""ONNX / TorchScript export: streaming equivalence with PyTorch, metadata, thresholds, atomic failure."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from kws.config import load_model_config
from kws.errors import KwsError
from kws.export import (
    EagerRunner,
    OnnxRunner,
    TorchScriptRunner,
    build_metadata,
    export_artifacts,
    recommended_thresholds,
    verify_exports,
)
from kws.model import build_model

ROOT = Path(__file__).resolve().parents[1]
KEYWORDS = ["<HI_XIAOWEN>", "<NIHAO_WENWEN>"]


def random_model(config_name="tiny.yaml", seed=0, overrides=None):
    """A model with random weights, random BatchNorm statistics and CMVN, so nothing is trivially zero."""
    conf = load_model_config(ROOT / "config" / "models" / config_name, overrides)
    dim = int(conf["dataset_conf"]["fbank_conf"]["num_mel_bins"])
    gen = torch.Generator().manual_seed(seed)
    cmvn = {
        "mean_stat": (torch.rand(dim, generator=gen) * 1000).tolist(),
        "var_stat": (torch.rand(dim, generator=gen) * 1000 + 20000).tolist(),
        "frame_num": 100,
    }
    with torch.random.fork_rng():  # the layers' own initialisation draws from the global generator
        torch.manual_seed(seed)
        model = build_model(conf["model"], dim, 2, cmvn)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("running_mean"):
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=gen))
            elif name.endswith("running_var"):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=gen))
    return model.eval(), conf


def make_checkpoint(root, seed=0):
    """avg.pt (layout of kws.checkpoint), dict, data.list with 4 noise/tone wavs, metrics.json."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    model, conf = random_model(seed=seed)
    torch.save(
        {"model": model.state_dict(), "config": conf, "num_keywords": 2, "input_dim": 40, "epoch": "avg"},
        root / "avg.pt",
    )
    (root / "words.txt").write_text("<FILLER> -1\n<HI_XIAOWEN> 0\n<NIHAO_WENWEN> 1\n")
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(4):
        n = 6000 + 2500 * i
        x = 0.05 * rng.standard_normal(n) + 0.3 * np.sin(2 * np.pi * (300 + 200 * i) * np.arange(n) / 16000)
        soundfile.write(str(root / f"u{i}.wav"), x.astype(np.float32), 16000, subtype="PCM_16")
        lines.append(
            json.dumps({"key": f"u{i}", "txt": i % 3 - 1, "duration": n / 16000, "wav": str(root / f"u{i}.wav")})
        )
    (root / "data.list").write_text("\n".join(lines) + "\n")
    metrics = {
        "fa_targets": [0.5, 1.0],
        "keywords": {
            "hi_xiaowen": {
                "token": "<HI_XIAOWEN>",
                "name": "hi_xiaowen",
                "operating_points": [
                    {"fa_per_hour_target": 0.5, "threshold": 0.81, "frr": 0.2, "fa_per_hour": 0.0},
                    {"fa_per_hour_target": 1.0, "threshold": 0.63, "frr": 0.1, "fa_per_hour": 0.9},
                ],
            },
            # no threshold reaches 1 FA/h (n/a in metrics.md): the export takes the default, and says so
            "nihao_wenwen": {
                "token": "<NIHAO_WENWEN>",
                "name": "nihao_wenwen",
                "operating_points": [{"fa_per_hour_target": 1.0, "threshold": None, "frr": None, "fa_per_hour": None}],
            },
        },
    }
    (root / "metrics.json").write_text(json.dumps(metrics))
    return root, model


def export_argv(root, out_dir):
    """export_model.py's arguments for make_checkpoint's files."""
    return [
        "--checkpoint",
        str(root / "avg.pt"),
        "--dict",
        str(root / "words.txt"),
        "--metrics",
        str(root / "metrics.json"),
        "--test-data",
        str(root / "data.list"),
        "--out-dir",
        str(out_dir),
        "--num-utts",
        "3",
    ]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """scripts/export_model.py run once on a random tiny checkpoint."""
    import importlib.util

    root, model = make_checkpoint(tmp_path_factory.mktemp("export"))
    spec = importlib.util.spec_from_file_location("export_model_script", ROOT / "scripts" / "export_model.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(export_argv(root, root / "out"))
    return root, model


def test_export_writes_files_and_report(export_dir):
    root, _ = export_dir
    out = root / "out"
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "model.onnx", "model.pt"]
    report = json.loads((out / "export.json").read_text())
    assert len(report["check"]["utterances"]) == 3
    for backend in ("onnx", "torchscript"):
        diffs = report["check"]["max_abs_diff"][backend]
        assert set(diffs) == {"whole", "chunked", "cache"}
        assert max(diffs.values()) <= 1e-5
    meta = report["meta"]
    assert meta["keywords"] == KEYWORDS
    assert meta["cache_shape"][0] == 1 and len(meta["cache_shape"]) == 3
    assert meta["fbank"]["dither"] == 0.0 and meta["fbank"]["training_dither"] == 1.0
    assert meta["fbank"]["dither_floor"] == 1.0  # what scoring adds, so the detector sees the same frames
    # threshold at the 1 FA/h operating point where metrics has it, 0.5 otherwise
    assert meta["thresholds"] == {"<HI_XIAOWEN>": 0.63, "<NIHAO_WENWEN>": 0.5}


def test_exports_of_the_same_checkpoint_are_byte_identical(tmp_path):
    # Two runs of the workflow's export step (a fresh process each, as Snakemake runs it): a rebuilt
    # model must be recognisably the same file (checksums, Snakemake's input checks, deployments).
    import subprocess
    import sys

    root, _ = make_checkpoint(tmp_path / "ckpt")
    for out in ("a", "b"):
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "export_model.py"), *export_argv(root, tmp_path / out)],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
    for name in ("model.pt", "model.onnx"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_onnx_metadata_and_io(export_dir):
    import onnx

    root, model = export_dir
    proto = onnx.load(str(root / "out" / "model.onnx"))
    props = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(props["keywords"]) == KEYWORDS
    assert json.loads(props["cache_shape"]) == list(model.init_cache(1).shape)
    assert json.loads(props["thresholds"])["<HI_XIAOWEN>"] == 0.63
    assert json.loads(props["fbank"])["num_mel_bins"] == 40
    assert [i.name for i in proto.graph.input] == ["feats", "cache"]
    assert [o.name for o in proto.graph.output] == ["posteriors", "new_cache"]
    time_dim = proto.graph.input[0].type.tensor_type.shape.dim[1]
    assert time_dim.dim_param  # dynamic time axis


def _torch_reference(model, feats):
    with torch.no_grad():
        logits, cache = model(feats)
    return torch.sigmoid(logits).numpy(), cache.numpy()


@pytest.mark.parametrize("backend", ["onnx", "torchscript"])
def test_exports_match_pytorch_whole_and_chunked(export_dir, backend):
    """Independent of the export-time check: load with onnxruntime / torch.jit directly."""
    import onnxruntime as ort

    root, model = export_dir
    feats = torch.randn(1, 137, 40, generator=torch.Generator().manual_seed(5)) * 3 + 10
    ref, ref_cache = _torch_reference(model, feats)
    zero = model.init_cache(1)
    if backend == "onnx":
        session = ort.InferenceSession(str(root / "out" / "model.onnx"), providers=["CPUExecutionProvider"])

        def step(x, c):
            return session.run(None, {"feats": x.numpy(), "cache": np.asarray(c)})
    else:
        module = torch.jit.load(str(root / "out" / "model.pt"))

        def step(x, c):
            with torch.no_grad():
                p, c = module(x, torch.as_tensor(c))
            return p.numpy(), c

    whole, cache = step(feats, zero)
    assert np.abs(whole - ref).max() <= 1e-5
    assert np.abs(np.asarray(cache) - ref_cache).max() <= 1e-4
    for chunk in (1, 3, 16, 50):
        cache, parts = zero, []
        for start in range(0, feats.shape[1], chunk):
            p, cache = step(feats[:, start : start + chunk], cache)
            parts.append(np.asarray(p))
        assert np.abs(np.concatenate(parts, axis=1) - ref).max() <= 1e-5, chunk


def test_torchscript_extra_file_holds_meta(export_dir):
    root, _ = export_dir
    extra = {"meta.json": ""}
    torch.jit.load(str(root / "out" / "model.pt"), _extra_files=extra)
    meta = json.loads(extra["meta.json"])
    assert meta["keywords"] == KEYWORDS and meta["thresholds"]["<HI_XIAOWEN>"] == 0.63


@pytest.mark.parametrize("config_name", ["gru.yaml", "mdtc.yaml", "tiny.yaml+sliding_cmn"])
def test_other_backbones_export(tmp_path, config_name):
    overrides = {"model.hidden_dim": 16}
    if config_name.endswith("+sliding_cmn"):  # its window's frames travel in the cache: ONNX and TorchScript too
        config_name = config_name.split("+")[0]
        overrides["model.preprocessing.sliding_cmn"] = 20
    if config_name == "mdtc.yaml":
        overrides.update({"model.backbone.stack_num": 2, "model.backbone.stack_size": 2})
    try:
        model, conf = random_model(config_name, seed=1, overrides=overrides)
    except KwsError:
        model, conf = random_model(config_name, seed=1)
    meta = build_metadata(model, conf, KEYWORDS, {k: 0.5 for k in KEYWORDS})
    gen = torch.Generator().manual_seed(2)
    dim = model.input_dim
    utts = [("a", torch.randn(41, dim, generator=gen) + 8), ("b", torch.randn(9, dim, generator=gen) + 8)]
    report = export_artifacts(model, meta, tmp_path, utts, chunks=(1, 7))
    assert max(max(d.values()) for d in report["check"]["max_abs_diff"].values()) <= 1e-5


class _Skewed:
    """A runner whose posteriors are off by `offset`."""

    backend = "skewed"

    def __init__(self, inner, offset=1e-3):
        self.inner, self.meta, self.offset = inner, inner.meta, offset

    def init_cache(self):
        return self.inner.init_cache()

    def run(self, feats, cache):
        p, c = self.inner.run(feats, cache)
        return p + self.offset, c


def test_verify_refuses_mismatch():
    model, conf = random_model(seed=3)
    meta = build_metadata(model, conf, KEYWORDS, {k: 0.5 for k in KEYWORDS})
    reference = EagerRunner(model, meta)
    utts = [("u", torch.randn(20, 40))]
    verify_exports(reference, [EagerRunner(model, meta)], utts)  # same model: passes
    with pytest.raises(KwsError, match="skewed whole differs"):
        verify_exports(reference, [_Skewed(EagerRunner(model, meta))], utts)
    # rounding: a trained default model's exports differed from eager by up to 1.03e-5
    verify_exports(reference, [_Skewed(EagerRunner(model, meta), offset=2e-5)], utts)


def test_failed_check_writes_nothing(tmp_path):
    model, conf = random_model(seed=4)
    meta = build_metadata(model, conf, KEYWORDS, {k: 0.5 for k in KEYWORDS})
    with pytest.raises(KwsError, match="export check failed"):
        export_artifacts(model, meta, tmp_path / "out", [("u", torch.randn(12, 40))], tolerance=-1.0)
    assert list((tmp_path / "out").iterdir()) == []


def test_keyword_count_mismatch_is_an_error(export_dir, tmp_path, capsys):
    import importlib.util

    root, _ = export_dir
    (tmp_path / "words.txt").write_text("<FILLER> -1\n<ONLY_ONE> 0\n")
    spec = importlib.util.spec_from_file_location("export_model_script2", ROOT / "scripts" / "export_model.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as info:
        script.main(
            [
                "--checkpoint",
                str(root / "avg.pt"),
                "--dict",
                str(tmp_path / "words.txt"),
                "--test-data",
                str(root / "data.list"),
                "--out-dir",
                str(tmp_path / "o"),
            ]
        )
    assert info.value.code == 1
    assert "1 keywords" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_recommended_thresholds_come_from_the_metrics_or_fail(export_dir, tmp_path):
    root, _ = export_dir
    result = recommended_thresholds(root / "metrics.json", KEYWORDS)
    assert result["<HI_XIAOWEN>"] == (0.63, "metrics.json: operating point at 1 FA/h (FRR 0.1000, 0.9 FA/h measured)")
    assert result["<NIHAO_WENWEN>"][0] == 0.5 and "no threshold reaches 1 FA/h" in result["<NIHAO_WENWEN>"][1]
    metrics = json.loads((root / "metrics.json").read_text())
    # a malformed file was once read as "no entry" and exported 0.5 for every keyword, silently
    for broken, message in [
        ({"something": "else"}, "not a kwsflow metrics.json"),
        (
            {**metrics, "keywords": {"hi_xiaowen": metrics["keywords"]["hi_xiaowen"]}},
            "no entry for keyword <NIHAO_WENWEN>",
        ),
        (
            {**metrics, "keywords": {**metrics["keywords"], "hi_xiaowen": {"token": "<HI_XIAOWEN>"}}},
            "without `token` and `operating_points`",
        ),
    ]:
        (tmp_path / "metrics.json").write_text(json.dumps(broken))
        with pytest.raises(KwsError, match=message):
            recommended_thresholds(tmp_path / "metrics.json", KEYWORDS)
    with pytest.raises(KwsError, match="no operating point at 2 FA/h"):
        recommended_thresholds(root / "metrics.json", KEYWORDS, fa_target=2.0)


def test_recommended_thresholds_on_ordinary_negatives(export_dir, tmp_path):
    """negatives=ordinary takes the point of kws.det's `ordinary` view, where the test set has one, and
    the all-negatives point where it has no confusables."""
    root, _ = export_dir
    metrics = json.loads((root / "metrics.json").read_text())
    hi = metrics["keywords"]["hi_xiaowen"]
    ordinary_point = {**hi["operating_points"][1], "threshold": 0.41, "frr": 0.02, "fa_per_hour": 0.8}
    hi["ordinary"] = {"operating_points": [ordinary_point]}
    metrics["keywords"]["nihao_wenwen"]["ordinary"] = None
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    result = recommended_thresholds(tmp_path / "metrics.json", KEYWORDS, negatives="ordinary")
    assert result["<HI_XIAOWEN>"] == (
        0.41,
        "metrics.json: operating point at 1 FA/h on ordinary negatives (FRR 0.0200, 0.8 FA/h measured)",
    )
    assert result["<NIHAO_WENWEN>"][0] == 0.5  # no confusables: its all-negatives point (none reaches 1 FA/h)
    assert recommended_thresholds(tmp_path / "metrics.json", KEYWORDS, negatives="all")["<HI_XIAOWEN>"][0] == 0.63
    with pytest.raises(KwsError, match="negatives must be all or ordinary"):
        recommended_thresholds(tmp_path / "metrics.json", KEYWORDS, negatives="some")


def test_recommended_thresholds_bad_file(tmp_path):
    assert recommended_thresholds(None, KEYWORDS)["<HI_XIAOWEN>"][0] == 0.5
    with pytest.raises(KwsError, match="not found"):
        recommended_thresholds(tmp_path / "missing.json", KEYWORDS)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(KwsError, match="bad.json:1: malformed JSON"):
        recommended_thresholds(tmp_path / "bad.json", KEYWORDS)


def test_runners_load_by_suffix(export_dir):
    from kws.runners import load_exported

    root, _ = export_dir
    assert isinstance(load_exported(root / "out" / "model.onnx"), OnnxRunner)
    assert isinstance(load_exported(root / "out" / "model.pt"), TorchScriptRunner)
    with pytest.raises(KwsError, match="not a TorchScript model"):
        load_exported(root / "avg.pt")
    with pytest.raises(KwsError, match="not found"):
        load_exported(root / "nope.onnx")


def _score(root, out):
    import subprocess
    import sys

    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "score.py"),
            "--checkpoint",
            str(root / "avg.pt"),
            "--test-data",
            str(root / "data.list"),
            "--dict",
            str(root / "words.txt"),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return out


def _export_deployed(root, out_dir, score, **options):
    """make_checkpoint's model exported with the deployed detector's check over its 4 utterances."""
    from kws.export import export_model

    return export_model(
        root / "avg.pt",
        root / "words.txt",
        out_dir,
        root / "data.list",
        metrics=root / "metrics.json",
        num_utts=2,
        score=score,
        refractory=0.05,
        chunk_ms=30,
        **options,
    )


def test_the_deployed_detector_is_scored_beside_offline(tmp_path):
    root, _ = make_checkpoint(tmp_path / "ckpt", seed=2)
    score = _score(root, tmp_path / "score.txt")
    # thresholds at which some frames fire: the 40th percentile of each keyword's posteriors
    from kws.datalist import read_dictionary
    from kws.det import read_scores

    table = read_scores(score, read_dictionary(root / "words.txt"))
    points = {token: round(float(np.percentile(np.concatenate(list(v.values())), 40)), 2) for token, v in table.items()}
    metrics = {
        "fa_targets": [1.0],
        "keywords": {
            token.strip("<>").lower(): {
                "token": token,
                "operating_points": [{"fa_per_hour_target": 1.0, "threshold": t}],
            }
            for token, t in points.items()
        },
    }
    (root / "metrics.json").write_text(json.dumps(metrics))
    report = _export_deployed(root, tmp_path / "out", score, window_shift=3, workers=2)
    deployed = json.loads((tmp_path / "out" / "export.json").read_text())["deployed"]
    assert deployed == json.loads(json.dumps(report["deployed"]))
    assert deployed["utterances"] == 4 and deployed["refractory_frames"] == 5
    for token, fig in deployed["keywords"].items():
        assert fig["threshold"] == report["meta"]["thresholds"][token]
        stream, offline = fig["streaming"], fig["offline_refractory"]
        assert (stream["misses"], stream["false_alarms"]) == (offline["misses"], offline["false_alarms"])
        assert stream["positives"] == 1 and offline["filler_hours"] == pytest.approx(stream["filler_hours"])
        assert fig["offline_window_shift"]["false_alarms"] >= offline["false_alarms"]  # 3 < 5 frames hold-off
    assert sum(fig["streaming"]["false_alarms"] for fig in deployed["keywords"].values()) > 0
    table = (tmp_path / "out" / "deployed.md").read_text()
    assert table.count("| streaming (deployed) |") == 2 and "offline, DET hold-off" in table


def test_a_detector_that_disagrees_with_offline_scoring_fails_the_export(tmp_path):
    root, _ = make_checkpoint(tmp_path / "ckpt", seed=3)
    score = _score(root, tmp_path / "score.txt")
    # offline posteriors that are not the model's: every frame certain
    lines = [
        " ".join(line.split()[:2] + ["1.000000"] * (len(line.split()) - 2)) for line in score.read_text().splitlines()
    ]
    score.write_text("\n".join(lines) + "\n")
    with pytest.raises(KwsError, match="deployed detector disagrees with offline scoring"):
        _export_deployed(root, tmp_path / "out", score)
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
