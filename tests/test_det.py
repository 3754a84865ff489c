import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kws.det import (
    compute_det,
    count_false_alarms,
    count_false_alarms_many,
    operating_point,
    read_stats,
    thresholds_for,
)
from kws.errors import KwsError
from kws.intervals import binomial_interval, poisson_interval, rate_interval
from kws.tables import compare_metrics, load_metrics

ROOT = Path(__file__).resolve().parents[1]


def naive_false_alarms(scores, threshold, window_shift):
    """WeKws compute_det.py's false-alarm count restated: a score at or above the threshold counts, then
    window_shift frames are skipped."""
    count, i = 0, 0
    while i < len(scores):
        if scores[i] >= threshold:
            count += 1
            i += window_shift
        else:
            i += 1
    return count


def test_thresholds():
    t = thresholds_for(0.01)
    assert len(t) == 100 and t[0] == 0.0 and t[-1] == 0.99 and t[7] == 0.07
    assert list(thresholds_for(0.3)) == [0.0, 0.3, 0.6, 0.9]
    with pytest.raises(KwsError):
        thresholds_for(0)


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_count_matches_loop(seed):
    rng = np.random.default_rng(seed)
    thr = thresholds_for(0.01)
    for _ in range(40):
        window = int(rng.integers(1, 40))
        utts = [
            np.round(rng.random(int(rng.integers(1, 300))) ** rng.uniform(0.2, 5), 2)
            for _ in range(int(rng.integers(1, 6)))
        ]
        expected = np.array([sum(naive_false_alarms(u, t, window) for u in utts) for t in thr])
        assert np.array_equal(
            count_false_alarms_many(utts, thr, window, chunk_frames=int(rng.integers(1, 500))), expected
        )
        assert np.array_equal(
            count_false_alarms(utts[0], thr, window), [naive_false_alarms(utts[0], t, window) for t in thr]
        )


def test_long_stream_crosses_chunks():
    rng = np.random.default_rng(1)
    scores = np.round(rng.random(50_000) ** 4, 3)
    thr = thresholds_for(0.05)
    got = count_false_alarms(scores, thr, 50)
    assert np.array_equal(got, [naive_false_alarms(scores, t, 50) for t in thr])
    assert np.all(np.diff(got) <= 0)  # the greedy count never grows with the threshold


def _write_case(tmp_path):
    (tmp_path / "words.txt").write_text("<FILLER> -1\n<HI_THERE> 0\n<YO> 1\n")
    items = [("p1", 0, 900.0), ("p2", 0, 900.0), ("f1", -1, 900.0), ("f2", 1, 1800.0)]
    with open(tmp_path / "data.list", "w") as out:
        for key, txt, dur in items:
            extra = {"kind": "near_miss", "voice": "v1"} if key == "f1" else {}
            out.write(json.dumps({"key": key, "txt": txt, "duration": dur, "wav": f"{key}.wav", **extra}) + "\n")
    hi = {
        "p1": [0.1, 0.7, 0.2],
        "p2": [0.3, 0.4],
        "f1": [0.6, 0.6, 0.6, 0.6, 0.2, 0.6],  # window 3: fires at frames 0 and 3 only (5 frames >= 0.5)
        "f2": [0.0, 0.9],
    }
    lines = []
    for key, values in hi.items():
        lines.append(f"{key} <HI_THERE> " + " ".join(f"{v:.6f}" for v in values))
        # <YO> never fires: all zeros; written with its integer id to exercise that form.
        lines.append(f"{key} 1 " + " ".join("0.000000" for _ in values))
    (tmp_path / "score.txt").write_text("\n".join(lines) + "\n")


def _det_of_case(tmp_path, out, **options):
    """compute_det of _write_case's files into tmp_path / out, with a hold-off of 3 frames."""
    return compute_det(
        tmp_path / "score.txt",
        tmp_path / "data.list",
        tmp_path / "words.txt",
        tmp_path / out,
        window_shift=3,
        **options,
    )


def _row(stats, threshold):
    i = int(np.argmin(np.abs(stats["threshold"] - threshold)))
    return stats["fa_per_hour"][i], stats["frr"][i]


def test_hand_computed_case(tmp_path):
    _write_case(tmp_path)
    out = tmp_path / "det"
    metrics = compute_det(
        tmp_path / "score.txt",
        tmp_path / "data.list",
        tmp_path / "words.txt",
        out,
        step=0.01,
        window_shift=3,
        fa_targets=[0.5, 1, 2, 5],
        experiment="toy",
    )
    hi = read_stats(out / "det" / "stats.hi_there.txt")
    assert len(hi["threshold"]) == 100
    # <HI_THERE>: fillers f1 + f2 = 0.75 h.
    assert _row(hi, 0.0) == pytest.approx((4.0, 0.0))  # f1: 2, f2: 1 -> 3 / 0.75
    assert _row(hi, 0.4) == pytest.approx((4.0, 0.0))
    assert _row(hi, 0.5) == pytest.approx((4.0, 0.5))  # p2 (max 0.4) rejected
    assert _row(hi, 0.61) == pytest.approx((1.333333, 0.5))  # only f2's 0.9
    assert _row(hi, 0.7) == pytest.approx((1.333333, 0.5))  # 0.7 >= 0.7: p1 accepted
    assert _row(hi, 0.71) == pytest.approx((1.333333, 1.0))
    assert _row(hi, 0.91) == pytest.approx((1.333e-6, 1.0), abs=1e-6)
    # stats line format: WeKws's 6 decimals.
    first = (out / "det" / "stats.hi_there.txt").read_text().splitlines()[0]
    assert first == "0.000000 4.000000 0.000000"

    yo = read_stats(out / "det" / "stats.yo.txt")
    # <YO> never fires: at t=0 every frame is >= 0 (p1: 1, p2: 1, f1: 2 with window 3) over 0.75 h.
    assert _row(yo, 0.0) == pytest.approx((4 / 0.75, 0.0))
    assert np.all(yo["frr"][1:] == 1.0)
    assert np.all(yo["fa_per_hour"][1:] < 1e-5)

    assert list(metrics["keywords"]) == ["hi_there", "yo"]
    kw = {k["token"]: k for k in metrics["keywords"].values()}
    hi_m = kw["<HI_THERE>"]
    assert hi_m["num_positives"] == 2 and hi_m["filler_hours"] == pytest.approx(0.75)
    points = {p["fa_per_hour_target"]: p for p in hi_m["operating_points"]}
    assert points[0.5]["frr"] == 1.0 and points[0.5]["threshold"] == 0.95 and points[0.5]["zero_fa_only"]
    assert points[1.0]["zero_fa_only"] and not points[2.0]["zero_fa_only"]
    # ties on FRR and FA/h: the middle of the tied run (0.61..0.70 -> lower middle 0.65)
    assert points[2.0]["frr"] == 0.5 and points[2.0]["threshold"] == pytest.approx(0.65)
    assert points[2.0]["false_alarms"] == 1 and points[0.5]["false_alarms"] == 0
    assert points[5.0]["frr"] == 0.0 and points[5.0]["threshold"] == pytest.approx(0.20)
    assert kw["<YO>"]["num_positives"] == 1
    assert kw["<YO>"]["stats_file"] == "det/stats.yo.txt" and metrics["experiment"] == "toy"

    # the counts behind each point, with 95 % intervals
    assert points[2.0]["false_rejects"] == 1 and points[2.0]["frr_ci95"] == pytest.approx(binomial_interval(1, 2))
    assert points[2.0]["fa_per_hour_ci95"] == pytest.approx(rate_interval(1, 0.75))
    assert points[0.5]["fa_per_hour_ci95"][0] == 0.0
    # 0.75 filler hours resolve targets from 3.0 / 0.75 = 4 FA/h: only 5 is resolved
    assert hi_m["fa_per_hour_resolved_from"] == pytest.approx(-np.log(0.05) / 0.75)
    assert [points[t]["resolved"] for t in (0.5, 1, 2, 5)] == [False, False, False, True]
    # false alarms by kind: f1 (near_miss, 0.25 h) and f2 (<YO>'s positive, 0.5 h); at 0.65 only f2 fires
    by_kind = points[2.0]["fa_per_hour_by_kind"]
    assert by_kind == {
        "near_miss": {"false_alarms": 0, "hours": 0.25, "fa_per_hour": 0.0},
        "other_keyword": {"false_alarms": 1, "hours": 0.5, "fa_per_hour": 2.0},
    }
    assert points[5.0]["fa_per_hour_by_kind"]["near_miss"]["false_alarms"] == 2  # t=0.20: f1 fires twice
    assert sum(e["false_alarms"] for e in points[5.0]["fa_per_hour_by_kind"].values()) == points[5.0]["false_alarms"]
    assert [m["key"] for m in hi_m["worst_misses"]] == ["p2", "p1"]
    assert hi_m["top_false_alarms"][0] == {
        "key": "f2",
        "kind": "other_keyword",
        "engine": "",
        "voice": "",
        "max_score": 0.9,
        "duration": 1800.0,
    }
    assert hi_m["top_false_alarms"][1]["kind"] == "near_miss" and hi_m["top_false_alarms"][1]["voice"] == "v1"

    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["keywords"]["hi_there"]["operating_points"][2]["threshold"] == pytest.approx(0.65)
    tsv = (out / "metrics.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:4] == ["experiment", "keyword", "fa_per_hour_target", "frr"]
    assert len(tsv) == 1 + 2 * 4
    row = dict(zip(tsv[0].split("\t"), tsv[3].split("\t")))
    assert [row[k] for k in ("fa_per_hour_target", "false_rejects", "false_alarms", "resolved")] == [
        "2",
        "1",
        "1",
        "false",
    ]
    md = (out / "metrics.md").read_text()
    assert "| <HI_THERE> | 2 FA/h | 50.00 % (1.3-98.7) \u2020 | 1 / 2 | 0.65 |" in md
    assert "1.33 (0.03-7.43) [1 in 0.75 h]" in md and "not resolved" in md
    assert "| near_miss | 0.250 |" in md and "| f1 | near_miss | v1 | 0.600 | 900.0 |" in md


def test_ordinary_negatives_leave_the_confusables_out_of_fa_per_hour(tmp_path):
    """The near-misses and partial keywords a test set makes on purpose are a rate of their own: the
    ordinary view's FA/h counts the other negatives, and each threshold reports the confusables it accepts."""
    _write_case(tmp_path)
    metrics = _det_of_case(tmp_path, "det", fa_targets=[1, 2])
    hi = metrics["keywords"]["hi_there"]
    ordinary = hi["ordinary"]
    # f1 (near_miss, 0.25 h) is left out: only f2 (0.5 h, max 0.9) counts
    assert ordinary["filler_hours"] == pytest.approx(0.5) and ordinary["num_confusables"] == 1
    assert ordinary["excluded_kinds"] == ["near_miss", "partial"]
    points = {p["fa_per_hour_target"]: p for p in ordinary["operating_points"]}
    # 2 FA/h: f2's one false alarm in 0.5 h is allowed at every threshold up to 0.9, so no positive need be
    # missed: the middle of 0.00..0.40; f1 (max 0.6) is accepted there
    assert points[2.0]["threshold"] == pytest.approx(0.20) and points[2.0]["frr"] == 0.0
    assert points[2.0]["false_alarms"] == 1 and set(points[2.0]["fa_per_hour_by_kind"]) == {"other_keyword"}
    assert points[2.0]["confusables_accepted"] == {
        "count": 1,
        "of": 1,
        "rate": 1.0,
        "ci95": pytest.approx(list(binomial_interval(1, 1))),
    }
    # with every negative counted, f1's two false alarms make 2 FA/h cost a positive
    assert {p["fa_per_hour_target"]: p for p in hi["operating_points"]}[2.0]["frr"] == 0.5
    # 1 FA/h needs zero false alarms: above 0.9, where f1 is rejected too
    assert points[1.0]["threshold"] == pytest.approx(0.95) and points[1.0]["confusables_accepted"]["count"] == 0
    md = (tmp_path / "det" / "metrics.md").read_text()
    assert "## Operating points on ordinary negatives" in md
    row = "| <HI_THERE> | 2 FA/h | 0.00 % (0.0-84.2) † | 0 / 2 | 0.20 | 2.00 (0.05-11.14) [1 in 0.50 h] | 100.00 %"
    assert row in md
    compared, _ = compare_metrics([("a", metrics)])
    assert "On ordinary negatives" in compared and compared.count("| <HI_THERE> | a |") == 2

    # a test set without confusables (the real corpora) has no second view
    lines = (tmp_path / "data.list").read_text().replace('"kind": "near_miss", ', "")
    (tmp_path / "data.list").write_text(lines)
    plain = _det_of_case(tmp_path, "plain")
    assert plain["keywords"]["hi_there"]["ordinary"] is None
    assert "ordinary negatives" not in (tmp_path / "plain" / "metrics.md").read_text()
    assert "On ordinary negatives" not in compare_metrics([("a", plain)])[0]


def test_intervals_match_published_values():
    # Clopper-Pearson and Garwood tables (e.g. Brown, Cai & DasGupta 2001; Garwood 1936)
    assert binomial_interval(0, 10) == pytest.approx((0.0, 0.30850), abs=1e-5)
    assert binomial_interval(5, 20) == pytest.approx((0.08657, 0.49105), abs=1e-5)
    assert binomial_interval(10, 10) == pytest.approx((0.69150, 1.0), abs=1e-5)
    assert poisson_interval(0) == pytest.approx((0.0, 3.68888), abs=1e-5)
    assert poisson_interval(1) == pytest.approx((0.02532, 5.57164), abs=1e-5)
    assert poisson_interval(10) == pytest.approx((4.79539, 18.39036), abs=1e-5)
    # the arithmetic: zero false alarms in 3 h bound the rate below 1 FA/h (one-sided 95 %)
    from kws.intervals import ZERO_EVENTS_UPPER

    assert ZERO_EVENTS_UPPER / 3.0 < 1.0 < ZERO_EVENTS_UPPER / 1.01


def test_malformed_metrics_is_an_error(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text('{"keywords": {"a": {"token": "<A>"}}, "fa_targets": [1]}')
    with pytest.raises(KwsError, match="metrics.json: a keyword entry without"):
        load_metrics(path)
    path.write_text("{")
    with pytest.raises(KwsError, match="metrics.json:1: malformed JSON"):
        load_metrics(path)


def test_operating_point_unreachable():
    curve = {"threshold": np.array([0.0, 0.5]), "fa_per_hour": np.array([9.0, 3.0]), "frr": np.array([0.0, 0.1])}
    assert operating_point(curve, 1.0) is None
    assert operating_point(curve, 3.0) == {"threshold": 0.5, "frr": 0.1, "fa_per_hour": 3.0}


def test_keyword_without_positives_is_an_error(tmp_path):
    _write_case(tmp_path)
    lines = (tmp_path / "data.list").read_text().replace('"txt": 1', '"txt": -1')
    (tmp_path / "data.list").write_text(lines)
    with pytest.raises(KwsError, match="<YO> has no positive"):
        compute_det(tmp_path / "score.txt", tmp_path / "data.list", tmp_path / "words.txt", tmp_path / "o")


def test_missing_scores_is_an_error(tmp_path):
    _write_case(tmp_path)
    lines = (tmp_path / "score.txt").read_text().splitlines()
    text = "\n".join(line for line in lines if not line.startswith("f2 "))
    (tmp_path / "score.txt").write_text(text + "\n")
    with pytest.raises(KwsError, match="first: f2"):
        compute_det(tmp_path / "score.txt", tmp_path / "data.list", tmp_path / "words.txt", tmp_path / "o")


def test_compare_metrics(tmp_path):
    _write_case(tmp_path)
    a = compute_det(
        tmp_path / "score.txt", tmp_path / "data.list", tmp_path / "words.txt", tmp_path / "a", window_shift=3
    )
    b = compute_det(
        tmp_path / "score.txt",
        tmp_path / "data.list",
        tmp_path / "words.txt",
        tmp_path / "b",
        window_shift=3,
        fa_targets=[1, 5],
    )
    md, tsv = compare_metrics([("exp_a", tmp_path / "a" / "metrics.json"), ("exp_b", b)])
    assert "| <HI_THERE> | exp_a |" in md and "| <YO> | exp_b |" in md
    assert "FRR @ 5 FA/h" in md and " - |" in md  # exp_a was not evaluated at 5 FA/h
    assert len(tsv.strip().splitlines()) == 1 + 2 * 3 + 2 * 2
    assert a["keywords"]["hi_there"]["token"] == "<HI_THERE>"

    # seeds: runs of one experiment get its median [min-max]
    c = json.loads(json.dumps(a))
    c["keywords"]["hi_there"]["operating_points"][2]["frr"] = 0.0  # 2 FA/h
    d = json.loads(json.dumps(a))
    d["keywords"]["hi_there"]["operating_points"][2]["frr"] = 1.0
    md, _ = compare_metrics([("s1", a), ("s2", c), ("s3", d), ("other", b)], ["exp", "exp", "exp", "other"])
    row = next(line for line in md.splitlines() if line.startswith("| <HI_THERE> | **exp**"))
    assert row.split(" | ")[-2:] == ["50.00 % [0.00-100.00]", "- |"]  # 2 FA/h; 5 FA/h not evaluated
    assert "median [min-max] of 3" in row and "**other**" not in md
    # a seed that meets no target is a failed seed, not a missing one: it counts as 100 %
    d["keywords"]["hi_there"]["operating_points"][2]["frr"] = None
    md, _ = compare_metrics([("s1", a), ("s2", c), ("s3", d)], ["exp"] * 3)
    row = next(line for line in md.splitlines() if line.startswith("| <HI_THERE> | **exp**"))
    assert row.split(" | ")[-1] == "50.00 % [0.00-100.00] ‡ |" and "‡ a run with n/a counts as 100 %" in md


def test_compare_metrics_with_a_heldout_split(tmp_path):
    """Experiments compared on the held-out engine's split too: its own tables, each run at the thresholds
    its export ships (chosen on test), each experiment's median over its seeds."""
    _write_case(tmp_path)
    test = _det_of_case(tmp_path, "test")
    held = [
        _det_of_case(tmp_path, f"held{i}", reference_thresholds={"<HI_THERE>": (t, "test"), "<YO>": (0.5, "test")})
        for i, t in enumerate((0.65, 0.3, 0.65))
    ]
    named = [("s1", test), ("s2", test), ("s3", test)]
    md, tsv = compare_metrics(named, ["exp"] * 3, heldout=held)
    before, section = md.split("## The held-out split (test_engine)")
    assert "s1/test_engine" not in before and "| <HI_THERE> | s2/test_engine |" in section
    # p1 (max 0.7) and p2 (0.4): found at 0.3, one missed at 0.65
    assert "| <HI_THERE> | s1/test_engine | 0.65 | 50.00 % (1.3-98.7) | 1 / 2 |" in section
    assert "| <HI_THERE> | s2/test_engine | 0.30 | 0.00 % (0.0-84.2) | 0 / 2 |" in section
    exported = section.split("At the exported thresholds")[1]
    row = next(line for line in exported.splitlines() if line.startswith("| <HI_THERE> | **exp**"))
    assert "50.00 % [0.00-50.00]" in row
    rows = [line.split("\t") for line in tsv.strip().splitlines()[1:]]
    assert {r[0] for r in rows} == {"s1", "s2", "s3", "s1/test_engine", "s2/test_engine", "s3/test_engine"}
    assert md.startswith(compare_metrics(named, ["exp"] * 3)[0])  # test's tables as without it
    with pytest.raises(KwsError, match="2 held-out metrics file"):
        compare_metrics(named, ["exp"] * 3, heldout=held[:2])


def test_cli(tmp_path):
    _write_case(tmp_path)
    run = [
        sys.executable,
        str(ROOT / "scripts" / "compute_det.py"),
        "--score",
        str(tmp_path / "score.txt"),
        "--test-data",
        str(tmp_path / "data.list"),
        "--dict",
        str(tmp_path / "words.txt"),
        "--window-shift",
        "3",
        "--out-dir",
        str(tmp_path / "cli"),
        "--fa-targets",
        "1",
        "2",
    ]
    proc = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cli" / "metrics.md").exists() and (tmp_path / "cli" / "det" / "stats.yo.txt").exists()
    compare = [
        sys.executable,
        str(ROOT / "scripts" / "compare_experiments.py"),
        "--metrics",
        str(tmp_path / "cli" / "metrics.json"),
        str(tmp_path / "cli" / "metrics.json"),
        "--names",
        "x",
        "y",
        "--experiments",
        "e",
        "e",
        "--out-md",
        str(tmp_path / "cmp.md"),
        "--out-tsv",
        str(tmp_path / "cmp.tsv"),
        "--out-plot",
        str(tmp_path / "cmp.png"),
    ]
    proc = subprocess.run(compare, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "median [min-max] of 2" in (tmp_path / "cmp.md").read_text() and (tmp_path / "cmp.png").stat().st_size
    assert "| <YO> | y |" in (tmp_path / "cmp.md").read_text()
    proc = subprocess.run(run[:-3] + ["--fa-targets", "-1"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1 and proc.stderr.startswith("error: ")

    # a held-out split scored at the thresholds the export takes from another split's metrics
    reference = run[: run.index("--out-dir")] + ["--out-dir", str(tmp_path / "engine")]
    reference += ["--reference-metrics", str(tmp_path / "cli" / "metrics.json"), "--reference-fa-target", "2"]
    for negatives in ("all", "ordinary"):
        proc = subprocess.run(
            reference + ["--reference-negatives", negatives], capture_output=True, text=True, cwd=ROOT
        )
        assert proc.returncode == 0, proc.stderr
        point = json.loads((tmp_path / "engine" / "metrics.json").read_text())["keywords"]["hi_there"]
        point = point["at_reference_threshold"]
        assert point["threshold"] == pytest.approx({"all": 0.65, "ordinary": 0.20}[negatives])
        assert point["source"] == f"{tmp_path / 'cli' / 'metrics.json'} at 2 FA/h ({negatives} negatives)"
    assert "## At the exported thresholds" in (tmp_path / "engine" / "metrics.md").read_text()
    proc = subprocess.run(reference[:-1] + ["7"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1 and "no operating point at 7 FA/h" in proc.stderr


def test_errors_at_a_threshold_chosen_elsewhere(tmp_path):
    """What a deployed detector does on a held-out split: its errors at the given thresholds, with the
    ordinary view beside them."""
    _write_case(tmp_path)
    metrics = _det_of_case(
        tmp_path, "det", reference_thresholds={"<HI_THERE>": (0.65, "elsewhere"), "<YO>": (0.5, "elsewhere")}
    )
    point = metrics["keywords"]["hi_there"]["at_reference_threshold"]
    # p1 (max 0.7) found, p2 (0.4) missed; f2 (0.9) fires once in 0.75 h, f1 (near_miss, 0.6) does not
    assert point["threshold"] == 0.65 and point["source"] == "elsewhere"
    assert point["false_rejects"] == 1 and point["frr"] == 0.5 and point["false_alarms"] == 1
    assert point["fa_per_hour"] == pytest.approx(1 / 0.75)
    assert point["ordinary"]["fa_per_hour"] == pytest.approx(2.0) and point["ordinary"]["false_alarms"] == 1
    assert point["ordinary"]["confusables_accepted"]["count"] == 0
    md = (tmp_path / "det" / "metrics.md").read_text()
    assert "| <HI_THERE> | 0.65 | 50.00 % (1.3-98.7) | 1 / 2 |" in md
    with pytest.raises(KwsError, match="no reference threshold for keyword <YO>"):
        _det_of_case(tmp_path, "other", reference_thresholds={"<HI_THERE>": (0.65, "elsewhere")})
