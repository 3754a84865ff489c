"""metrics.json (kws.det) read back and tabled: its reader (`load_metrics`, `keyword_entries`),
metrics.tsv and metrics.md of one run, and the comparison of runs, with each experiment's median, min
and max over its seeds.

Every FRR is shown with its 95 % interval and its count (misses / positives), every FA/h with its 95 %
interval and its count (false alarms in the filler hours); a target the filler hours do not resolve is
marked (zero false alarms would not show the rate below it).
"""

import json
import math
import statistics
from pathlib import Path

from kws.errors import KwsError
from kws.keywords import keyword_slug

TSV_COLUMNS = (
    "experiment",
    "keyword",
    "fa_per_hour_target",
    "frr",
    "frr_low",
    "frr_high",
    "false_rejects",
    "num_positives",
    "threshold",
    "fa_per_hour",
    "fa_per_hour_low",
    "fa_per_hour_high",
    "false_alarms",
    "filler_hours",
    "zero_fa_only",
    "resolved",
)
POINT_COLUMNS = ("Keyword", "Operating point", "FRR (95 % CI)", "Misses", "Threshold")  # metrics.md's tables
DEFAULT_THRESHOLD = 0.5  # a keyword whose metrics meet no target gets it (and says so)
DEFAULT_FA_TARGET = 1.0  # the operating point whose thresholds a detector takes
UNRESOLVED_NOTE = (
    "\u2020 not resolved: even zero false alarms in this many filler hours would not show the rate "
    "below the target (95 %, one-sided), so the test set cannot show that this threshold meets it."
)


def _num(value, digits=6):
    return "" if value is None else f"{value:.{digits}f}"


def _ci(point, key, index):
    return None if point.get(key) is None else point[key][index]


def _tsv_rows(metrics, experiment=None):
    name = experiment if experiment is not None else (metrics.get("experiment") or "")
    for kw in keyword_entries(metrics):
        for point in kw["operating_points"]:
            yield [
                name,
                kw["token"],
                f"{point['fa_per_hour_target']:g}",
                _num(point["frr"]),
                _num(_ci(point, "frr_ci95", 0)),
                _num(_ci(point, "frr_ci95", 1)),
                "" if point.get("false_rejects") is None else str(point["false_rejects"]),
                str(kw["num_positives"]),
                _num(point["threshold"], 2),
                _num(point["fa_per_hour"]),
                _num(_ci(point, "fa_per_hour_ci95", 0)),
                _num(_ci(point, "fa_per_hour_ci95", 1)),
                "" if point.get("false_alarms") is None else str(point["false_alarms"]),
                f"{kw['filler_hours']:.4f}",
                str(point["zero_fa_only"]).lower(),
                str(point.get("resolved", True)).lower(),
            ]


def metrics_tsv(metrics):
    """Long-format TSV: one row per keyword and FA/h target."""
    lines = ["\t".join(TSV_COLUMNS)]
    lines += ["\t".join(row) for row in _tsv_rows(metrics)]
    return "\n".join(lines) + "\n"


def _pct(value):
    return f"{100 * value:.2f} %"


def _frr_cell(point):
    if point.get("frr") is None:
        return "n/a"
    text = _pct(point["frr"])
    if point.get("frr_ci95"):
        low, high = point["frr_ci95"]
        text += f" ({100 * low:.1f}-{100 * high:.1f})"
    return text + ("" if point.get("resolved", True) else " \u2020")


def _fa_cell(point, hours):
    if point.get("fa_per_hour") is None:
        return "n/a"
    alarms = point.get("false_alarms")
    rate = 0.0 if alarms == 0 else point["fa_per_hour"]  # not WeKws's 1e-6 floor
    text = f"{rate:.2f}"
    if point.get("fa_per_hour_ci95"):
        low, high = point["fa_per_hour_ci95"]
        text += f" ({low:.2f}-{high:.2f})"
    return text + ("" if alarms is None else f" [{alarms} in {hours:.2f} h]")


def _misses(point, positives):
    return "" if point.get("false_rejects") is None else f"{point['false_rejects']} / {positives}"


def _keyword_rows(kw):
    points = [(f"{p['fa_per_hour_target']:g} FA/h", p) for p in kw["operating_points"]]
    points.append(("t = 0.5", kw["at_threshold_0.5"]))
    for label, point in points:
        threshold = "" if point.get("threshold") is None else f"{point['threshold']:.2f}"
        yield [
            kw["token"],
            label,
            _frr_cell(point),
            _misses(point, kw["num_positives"]),
            threshold,
            _fa_cell(point, kw["filler_hours"]),
        ]


def _accepted_cell(point):
    accepted = point.get("confusables_accepted")
    if not accepted:
        return "n/a"
    low, high = accepted["ci95"]
    return f"{_pct(accepted['rate'])} ({100 * low:.1f}-{100 * high:.1f}) [{accepted['count']} / {accepted['of']}]"


def _section_head(title, note, header):
    """A metrics.md section's title, its one-paragraph note and its table's header rows."""
    return [f"## {title}", "", note, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]


def _ordinary_table(metrics):
    """Operating points with FA/h over the ordinary negatives (kws.det: no near-misses or partial keywords),
    and the confusables each threshold accepts; [] when no keyword has confusables in its test set."""
    entries = [kw for kw in keyword_entries(metrics) if kw.get("ordinary")]
    if not entries:
        return []
    header = [*POINT_COLUMNS, "FA/h on ordinary negatives (95 % CI)", "Confusables accepted (95 % CI)"]
    excluded = " and ".join(entries[0]["ordinary"]["excluded_kinds"])
    lines = _section_head(
        "Operating points on ordinary negatives",
        f"FA/h counted without the confusables ({excluded}: made to be hard, at a share of the test set's "
        "hours that is a choice, not a rate of everyday audio); beside each threshold, the share of "
        "confusable utterances it accepts.",
        header,
    )
    for kw in entries:
        ordinary = kw["ordinary"]
        points = [(f"{p['fa_per_hour_target']:g} FA/h", p) for p in ordinary["operating_points"]]
        points.append(("t = 0.5", ordinary["at_threshold_0.5"]))
        for label, point in points:
            threshold = "" if point.get("threshold") is None else f"{point['threshold']:.2f}"
            cells = [kw["token"], label, _frr_cell(point), _misses(point, kw["num_positives"]), threshold]
            cells += [_fa_cell(point, ordinary["filler_hours"]), _accepted_cell(point)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _reference_table(metrics):
    """This test set's errors at thresholds chosen on another (kws.det `at_reference_threshold`)."""
    entries = [kw for kw in keyword_entries(metrics) if kw.get("at_reference_threshold")]
    if not entries:
        return []
    header = ["Keyword", "Threshold", "FRR (95 % CI)", "Misses", "FA/h (95 % CI) [false alarms in filler hours]"]
    header += ["FA/h on ordinary negatives", "Confusables accepted (95 % CI)", "Chosen at"]
    lines = _section_head(
        "At the exported thresholds",
        "Thresholds chosen on another test set, as the export chooses them: what the exported detector does "
        "on this one.",
        header,
    )
    for kw in entries:
        point = kw["at_reference_threshold"]
        ordinary = point.get("ordinary")
        cells = [kw["token"], f"{point['threshold']:.2f}", _frr_cell(point), _misses(point, kw["num_positives"])]
        cells.append(_fa_cell(point, kw["filler_hours"]))
        if ordinary:
            cells += [_fa_cell(ordinary, ordinary["hours"]), _accepted_cell(ordinary)]
        else:
            cells += ["n/a", "n/a"]
        cells.append(point["source"])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _by_kind_table(kw):
    """False alarms by negative kind at each operating point's threshold."""
    points = [p for p in kw["operating_points"] if p.get("fa_per_hour_by_kind")]
    hours = kw.get("filler_hours_by_kind") or {}
    if not points or not hours:
        return []
    header = ["Kind", "Hours"] + [f"at {p['fa_per_hour_target']:g} FA/h (t={p['threshold']:.2f})" for p in points]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind in sorted(hours, key=lambda k: -hours[k]):
        cells = [kind, f"{hours[kind]:.3f}"]
        for point in points:
            entry = point["fa_per_hour_by_kind"][kind]
            cells.append(f"{entry['false_alarms']} ({entry['fa_per_hour']:.2f} FA/h)")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _listed(entries, what):
    if not entries:
        return []
    lines = [f"{what}:", "", "| Key | Kind | Engine / voice | Max score | Seconds |", "|---|---|---|---|---|"]
    for e in entries:
        who = " / ".join(x for x in (e.get("engine"), e.get("voice")) if x) or "-"
        lines.append(f"| {e['key']} | {e['kind']} | {who} | {e['max_score']:.3f} | {e['duration']:.1f} |")
    return lines + [""]


def metrics_markdown(metrics, title=None):
    """metrics.md: per keyword its operating points with intervals and counts, false alarms by kind, the
    worst misses and the top false alarms."""
    heading = title or (f"Metrics: {metrics['experiment']}" if metrics.get("experiment") else "Metrics")
    header = [*POINT_COLUMNS, "FA/h (95 % CI) [false alarms in filler hours]"]
    lines = [f"# {heading}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    unresolved = False
    for kw in keyword_entries(metrics):
        lines += ["| " + " | ".join(row) + " |" for row in _keyword_rows(kw)]
        unresolved |= not all(p.get("resolved", True) for p in kw["operating_points"])
    lines += [
        "",
        f"Thresholds step {metrics['step']}, window shift {metrics['window_shift']} frames; the operating "
        "point of a target: the lowest FRR with FA/h at or below it, then the lowest FA/h (ties: the middle "
        "threshold); n/a: no threshold meets it. Intervals: Clopper-Pearson (FRR), exact Poisson (FA/h).",
    ]
    for kw in keyword_entries(metrics):
        lines.append(
            f"\n{kw['token']}: {kw['num_positives']} positives, {kw['filler_hours']:.2f} filler hours "
            f"(zero false alarms resolve targets from {kw.get('fa_per_hour_resolved_from', 0):.2f} FA/h)."
        )
    if unresolved:
        lines += ["", UNRESOLVED_NOTE]
    for table in (_ordinary_table(metrics), _reference_table(metrics)):
        if table:
            lines += [""] + table
    for kw in keyword_entries(metrics):
        table = _by_kind_table(kw)
        if table:
            lines += ["", f"## {kw['token']}: false alarms by kind of negative", ""] + table
        listed = _listed(kw.get("worst_misses"), "Worst misses (lowest maximum score)")
        listed += _listed(kw.get("top_false_alarms"), "Top false alarms (highest maximum score)")
        if listed:
            lines += ["", f"## {kw['token']}: worst misses and top false alarms", ""] + listed
    return "\n".join(lines).rstrip() + "\n"


NA_AS_ALL_NOTE = (
    "‡ a run with n/a counts as 100 % in the median [min-max]: no threshold meets the target, so at any "
    "threshold that does it would miss every keyword."
)


def _spread_cell(values):
    """median [min-max] over runs; a run where no threshold meets the target (None) counts as FRR 100 %,
    not as a missing run, so that a failed seed cannot improve its experiment's median."""
    if not values or all(v is None for v in values):
        return "n/a"
    marked = " ‡" if any(v is None for v in values) else ""
    values = [1.0 if v is None else v for v in values]
    return f"{100 * statistics.median(values):.2f} % [{100 * min(values):.2f}-{100 * max(values):.2f}]{marked}"


def _all_points(kw):
    return kw["operating_points"], kw["filler_hours"]


def _ordinary_points(kw):
    ordinary = kw.get("ordinary")
    return (ordinary["operating_points"], ordinary["filler_hours"]) if ordinary else None


def _keyword_runs(loaded, experiments):
    """(token, [(run, experiment, keyword entry), ...]) for each keyword of any run, in first-seen order."""
    tokens = list(dict.fromkeys(kw["token"] for _, m in loaded for kw in keyword_entries(m)))
    for token in tokens:
        runs = []
        for (name, m), exp in zip(loaded, experiments):
            kw = next((k for k in keyword_entries(m) if k["token"] == token), None)
            if kw is not None:
                runs.append((name, exp, kw))
        yield token, runs


def _comparison_rows(loaded, experiments, targets, points_of):
    """Rows of the comparison table (one per keyword and run, plus each experiment's median [min-max] over
    its seeds) for the operating points and filler hours `points_of(keyword entry)` gives (None: the run
    has no such points)."""
    md = []
    for token, runs in _keyword_runs(loaded, experiments):
        runs_of = {}
        for name, exp, kw in runs:
            view = points_of(kw)
            if view is None:
                continue
            points, hours = view
            by_target = {float(p["fa_per_hour_target"]): p for p in points}
            runs_of.setdefault(exp, []).append(by_target)
            cells = [token, str(name), str(kw["num_positives"]), f"{hours:.4g}"]
            cells += [_frr_cell(by_target[t]) if t in by_target else "-" for t in targets]
            md.append("| " + " | ".join(cells) + " |")
        for exp, runs in runs_of.items():
            if len(runs) > 1:
                cells = [token, f"**{exp}**: median [min-max] of {len(runs)}", "", ""]
                cells += [
                    _spread_cell([r[t]["frr"] for r in runs if t in r]) if any(t in r for r in runs) else "-"
                    for t in targets
                ]
                md.append("| " + " | ".join(cells) + " |")
    return md


def _exported_rows(loaded, experiments):
    """Rows of each run's errors at the thresholds its export takes from another test set (kws.det
    `at_reference_threshold`), plus each experiment's median [min-max] FRR over its seeds."""
    md = []
    for token, runs in _keyword_runs(loaded, experiments):
        runs_of = {}
        for name, exp, kw in runs:
            point = kw.get("at_reference_threshold")
            if not point:
                continue
            runs_of.setdefault(exp, []).append(point["frr"])
            ordinary = point.get("ordinary")
            cells = [token, str(name), f"{point['threshold']:.2f}", _frr_cell(point)]
            cells += [_misses(point, kw["num_positives"]), _fa_cell(ordinary, ordinary["hours"]) if ordinary else "n/a"]
            md.append("| " + " | ".join(cells) + " |")
        for exp, values in runs_of.items():
            if len(values) > 1:
                cells = [token, f"**{exp}**: median [min-max] of {len(values)}", "", _spread_cell(values), "", ""]
                md.append("| " + " | ".join(cells) + " |")
    return md


def _loaded(named, experiments):
    loaded = [(name, m if isinstance(m, dict) else load_metrics(m)) for name, m in named]
    if not loaded:
        raise KwsError("no experiments to compare")
    experiments = list(experiments) if experiments else [name for name, _ in loaded]
    if len(experiments) != len(loaded):
        raise KwsError(f"{len(experiments)} experiment name(s) for {len(loaded)} run(s)")
    return loaded, experiments


def compare_metrics(named, experiments=None, heldout=None, heldout_split="test_engine"):
    """Compare runs: `named` is a list of (run, metrics.json path or dict) -> (markdown, tsv).

    experiments: the experiment of each run (same order; default: each run its own). An experiment with
    several runs (seeds) gets a row of the median FRR with [min-max] over them. The Markdown table has one
    row per keyword and run; FA/h targets are the union over runs (a target a run was not evaluated at
    shows `-`). When the runs' test sets have confusables (kws.det), a second table gives the operating
    points on ordinary negatives.

    heldout: each run's metrics of a held-out split (same order as `named`; corpus.heldout_engine's
    test_engine): a section of its own with the same tables and the runs at their exported thresholds,
    and TSV rows whose experiment is `run/heldout_split`.
    """
    loaded, experiments = _loaded(named, experiments)
    markdown, tsv = _comparison(loaded, experiments)
    if heldout is None:
        return markdown, tsv
    if len(heldout) != len(loaded):
        raise KwsError(f"{len(heldout)} held-out metrics file(s) for {len(loaded)} run(s)")
    held = [(f"{name}/{heldout_split}", m) for (name, _), m in zip(loaded, heldout)]
    held, _ = _loaded(held, experiments)
    held_md, held_tsv = _comparison(held, experiments)
    exported = _exported_rows(held, experiments)
    markdown += f"\n## The held-out split ({heldout_split})\n\n" + held_md
    if exported:
        header = ["Keyword", "Run", "Threshold", "FRR (95 % CI)", "Misses", "FA/h on ordinary negatives"]
        title = f"At the exported thresholds ({heldout_split})"
        note = "Thresholds chosen on test, as the export chooses them: what each exported detector does on this split."
        markdown += "\n" + "\n".join(_section_head(title, note, header) + exported) + "\n"
    return markdown, tsv + held_tsv.split("\n", 1)[1]


def _comparison(loaded, experiments):
    """compare_metrics' tables of one test set."""
    targets = sorted({float(t) for _, m in loaded for t in m["fa_targets"]})
    header = ["Keyword", "Run", "Positives", "Filler hours"] + [f"FRR @ {t:g} FA/h" for t in targets]
    table_head = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md = table_head + _comparison_rows(loaded, experiments, targets, _all_points)
    unresolved = any(
        not all(p.get("resolved", True) for p in kw["operating_points"]) for _, m in loaded for kw in keyword_entries(m)
    )
    tsv = ["\t".join(TSV_COLUMNS)]
    for name, m in loaded:
        tsv += ["\t".join(row) for row in _tsv_rows(m, experiment=str(name))]
    md += ["", "FRR with its 95 % interval; n/a: no threshold meets the target."]
    ordinary = _comparison_rows(loaded, experiments, targets, _ordinary_points)
    if ordinary:
        md += [
            "",
            "On ordinary negatives: FA/h without the near-misses and partial keywords (each run's metrics.md "
            "gives the share of them its thresholds accept); the hours are the ordinary ones.",
            "",
        ]
        md += table_head + ordinary
    if any("‡" in line for line in md):
        md += ["", NA_AS_ALL_NOTE]
    if unresolved:
        md += ["", UNRESOLVED_NOTE]
    return "\n".join(md) + "\n", "\n".join(tsv) + "\n"


def keyword_entries(metrics):
    """The per-keyword summaries of a metrics dict, in dictionary order (`keywords` maps name -> entry)."""
    node = metrics["keywords"]
    return list(node.values()) if isinstance(node, dict) else list(node)


def load_metrics(path):
    """A kwsflow metrics.json; a one-line KwsError naming the file when missing or malformed."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise KwsError(f"{path}: metrics file not found") from None
    except UnicodeDecodeError as err:
        raise KwsError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise KwsError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("keywords"), (dict, list)) or "fa_targets" not in data:
        raise KwsError(f"{path}: not a kwsflow metrics.json (no `keywords` and `fa_targets`)")
    for entry in keyword_entries(data):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("token"), str)
            or not isinstance(entry.get("operating_points"), list)
        ):
            raise KwsError(f"{path}: a keyword entry without `token` and `operating_points`: {str(entry)[:80]}")
    return data


# --------------------------------------------------------------------------- thresholds


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def recommended_thresholds(
    metrics_path, keywords, fa_target=DEFAULT_FA_TARGET, default=DEFAULT_THRESHOLD, negatives="ordinary"
):
    """Per keyword token: (threshold, where it came from), from metrics.json's operating point at
    `fa_target` FA/h. A missing or malformed file, a keyword it lacks, or a target it was not evaluated
    at is a KwsError; only a target no threshold meets (n/a in metrics.md) takes `default`, and says so.

    negatives: `all` (FA/h over every negative, WeKws's) or `ordinary` (kws.det: without the near-misses
    and partial keywords; a keyword whose test set has none takes its all-negatives point, the same)."""
    if metrics_path is None:
        return {kw: (default, "default (no metrics given)") for kw in keywords}
    if negatives not in ("all", "ordinary"):
        raise KwsError(f"negatives must be all or ordinary, got {negatives!r}")
    path = Path(metrics_path)
    entries = {keyword_slug(entry["token"]): entry for entry in keyword_entries(load_metrics(path))}
    result = {}
    for kw in keywords:
        entry = entries.get(keyword_slug(kw))
        if entry is None:
            raise KwsError(f"{path}: no entry for keyword {kw} (metrics of another test set or dictionary?)")
        ordinary = entry.get("ordinary") if negatives == "ordinary" else None
        if ordinary is not None and not isinstance(ordinary.get("operating_points"), list):
            raise KwsError(f"{path}: {kw}: `ordinary` without `operating_points`")
        which = "on ordinary negatives " if ordinary else ""
        chosen = next(
            (
                p
                for p in (ordinary or entry)["operating_points"]
                if isinstance(p, dict)
                and _number(p.get("fa_per_hour_target")) is not None
                and abs(float(p["fa_per_hour_target"]) - fa_target) < 1e-9
            ),
            None,
        )
        if chosen is None:
            raise KwsError(
                f"{path}: {kw} has no operating point at {fa_target:g} FA/h (add it to det.fa_targets "
                f"or choose --fa-target from them)"
            )
        threshold = _number(chosen.get("threshold"))
        if chosen.get("threshold") is None:
            result[kw] = (
                default,
                f"default ({path.name}: no threshold reaches {fa_target:g} FA/h {which}for {kw})",
            )
            continue
        if threshold is None or not 0.0 <= threshold <= 1.0:
            raise KwsError(
                f"{path}: {kw}: threshold {chosen.get('threshold')!r} at {fa_target:g} FA/h is not a number in [0, 1]"
            )
        frr = _number(chosen.get("frr"))
        fa = _number(chosen.get("fa_per_hour"))
        detail = ", ".join(
            x
            for x in (f"FRR {frr:.4f}" if frr is not None else "", f"{fa:.3g} FA/h measured" if fa is not None else "")
            if x
        )
        result[kw] = (
            threshold,
            f"{path.name}: operating point at {fa_target:g} FA/h {which}".rstrip() + (f" ({detail})" if detail else ""),
        )
    return result
