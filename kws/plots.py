"""Plots (matplotlib, Agg backend): DET curves from stats files and training curves from train_log.tsv.

DET plots show FRR (%) against false alarms per hour on a log x axis. Thresholds that gave no false
alarm at all (FA/h is WeKws's floor max(n, 1e-6) / hours, far below any real rate) are drawn at the
left edge of the axis (the x label says so), so a curve that reaches the edge means "no
false alarm in the test filler audio". Dotted vertical lines mark the FA/h targets of the metrics.
Every PNG is written atomically.
"""

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kws.errors import KwsError  # noqa: E402

ZERO_FA = 1e-4  # FA/h below this is WeKws's "no false alarm" floor (a real rate needs > 10^4 filler hours)
DEFAULT_TARGETS = (0.5, 1.0, 2.0)
_LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
_STATS_RE = re.compile(r"^stats\.(.+)\.txt$")


def _save(fig, out):
    from kws.fileio import atomic_path

    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def keyword_from_stats(path):
    """`.../stats.hi_xiaowen.txt` -> `hi_xiaowen`."""
    match = _STATS_RE.match(Path(path).name)
    return match.group(1) if match else Path(path).stem


def experiment_from_stats(path):
    """The experiment folder of a stats file: `<exp>/det/stats.x.txt` or `<exp>/stats.x.txt` -> `<exp>`."""
    parent = Path(path).resolve().parent
    return parent.parent.name if parent.name == "det" else parent.name


def _curve_xy(stats, left):
    fa = np.asarray(stats["fa_per_hour"], dtype=float)
    frr = 100.0 * np.asarray(stats["frr"], dtype=float)
    x = np.where(fa < ZERO_FA, left, fa)
    order = np.lexsort((-frr, x))  # by FA/h, and within equal FA/h from high to low FRR: a staircase
    return x[order], frr[order]


def det_axes(ax, curves, title=None, fa_targets=DEFAULT_TARGETS):
    """Draw curves [(label, stats, style dict)] on `ax` (log x FA/h, y FRR %)."""
    if not curves:
        raise KwsError("no DET curves to plot")
    real = [float(v) for _, s, _ in curves for v in np.asarray(s["fa_per_hour"]) if v >= ZERO_FA]
    left = min(min(real) if real else 0.1, 0.1) / 2.0
    right = max(max(real) if real else 1.0, max(fa_targets or [1.0])) * 1.5
    for label, stats, style in curves:
        x, y = _curve_xy(stats, left)
        ax.plot(x, y, label=label, linewidth=1.6, **style)
    for target in fa_targets or ():
        ax.axvline(target, color="0.6", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlim(left / 1.2, right)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("False alarms per hour (log scale; left edge: no false alarm)")
    ax.set_ylabel("False reject rate (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)


def plot_det(stats_paths, out, labels=None, title=None, fa_targets=DEFAULT_TARGETS):
    """One DET curve per stats file (one per keyword) -> PNG."""
    from kws.det import read_stats

    stats_paths = list(stats_paths)
    labels = list(labels) if labels else [keyword_from_stats(p) for p in stats_paths]
    if len(labels) != len(stats_paths):
        raise KwsError(f"--labels: {len(labels)} label(s) for {len(stats_paths)} stats file(s)")
    curves = [(label, read_stats(path), {}) for label, path in zip(labels, stats_paths)]
    fig, ax = plt.subplots(figsize=(7, 5))
    det_axes(ax, curves, title=f"DET: {title}" if title else "DET", fa_targets=fa_targets)
    _save(fig, out)
    return Path(out)


def plot_det_compare(groups, out, title=None, fa_targets=DEFAULT_TARGETS):
    """Compare experiments: `groups` is [(experiment, [stats paths])]; colour = experiment, line style = keyword."""
    from kws.det import read_stats

    groups = [(name, list(paths)) for name, paths in groups]
    if not groups or not any(paths for _, paths in groups):
        raise KwsError("no stats files to compare")
    keywords = []
    for _, paths in groups:
        for path in paths:
            if keyword_from_stats(path) not in keywords:
                keywords.append(keyword_from_stats(path))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    curves = []
    for index, (name, paths) in enumerate(groups):
        for path in paths:
            keyword = keyword_from_stats(path)
            style = {
                "color": colours[index % len(colours)],
                "linestyle": _LINESTYLES[keywords.index(keyword) % len(_LINESTYLES)],
            }
            curves.append((f"{name} / {keyword}", read_stats(path), style))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    det_axes(ax, curves, title=title or "DET comparison", fa_targets=fa_targets)
    _save(fig, out)
    return Path(out)


def group_stats_by_experiment(stats_paths, names=None):
    """[(experiment, [stats paths])] in first-seen order; experiment from the path (or `names`)."""
    groups = {}
    for path in stats_paths:
        groups.setdefault(experiment_from_stats(path), []).append(Path(path))
    items = list(groups.items())
    if names:
        if len(names) != len(items):
            raise KwsError(f"--labels: {len(names)} name(s) for {len(items)} experiment(s)")
        items = [(name, paths) for name, (_, paths) in zip(names, items)]
    return items


def stats_in_dir(folder):
    """Stats files of a metrics folder (`<dir>/det/stats.*.txt`, else `<dir>/stats.*.txt`), sorted."""
    folder = Path(folder)
    for candidate in (folder / "det", folder):
        found = sorted(p for p in candidate.glob("stats.*.txt") if _STATS_RE.match(p.name))
        if found:
            return found
    raise KwsError(f"{folder}: no stats.<keyword>.txt files (in det/ or the folder itself)")


# --------------------------------------------------------------------------- training curves

TRAIN_COLUMNS = (
    "epoch",
    "train_loss",
    "cv_loss",
    "cv_acc",
    "lr",
    "grad_norm",
    "skipped_steps",
    "seconds",
    "utts_per_s",
)


def read_train_log(path):
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise KwsError(f"{path}: training log not found")
    try:
        frame = pd.read_csv(path, sep="\t")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise KwsError(f"{path}: malformed training log ({str(err).splitlines()[0]})") from None
    missing = [c for c in ("epoch", "train_loss", "cv_loss") if c not in frame.columns]
    if missing:
        raise KwsError(f"{path}: missing column(s) {', '.join(missing)} (expected {' '.join(TRAIN_COLUMNS)})")
    if frame.empty:
        raise KwsError(f"{path}: no epochs logged yet")
    return frame.sort_values("epoch", kind="stable")


def plot_training(log_path, out, title=None):
    """train/cv loss, cv accuracy, learning rate and gradient norm per epoch -> PNG (2 x 2 subplots)."""
    frame = read_train_log(log_path)
    epoch = frame["epoch"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    ax = axes[0, 0]
    ax.plot(epoch, frame["train_loss"], marker=".", label="train")
    ax.plot(epoch, frame["cv_loss"], marker=".", label="cv")
    best = frame["cv_loss"].idxmin() if frame["cv_loss"].notna().any() else None
    if best is not None:
        ax.plot(
            frame.loc[best, "epoch"],
            frame.loc[best, "cv_loss"],
            "k*",
            markersize=10,
            label=f"best cv (epoch {int(frame.loc[best, 'epoch'])})",
        )
    ax.set_ylabel("loss")
    ax.set_title("Loss")
    ax.legend(fontsize="small")

    ax = axes[0, 1]
    if "cv_acc" in frame:
        ax.plot(epoch, frame["cv_acc"], marker=".", color="tab:green")
    ax.set_ylabel("accuracy")
    ax.set_title("CV accuracy")

    ax = axes[1, 0]
    if "lr" in frame:
        ax.plot(epoch, frame["lr"], marker=".", color="tab:purple", drawstyle="steps-post")
        if (frame["lr"] > 0).all():
            ax.set_yscale("log")
    ax.set_ylabel("learning rate")
    ax.set_title("Learning rate")

    ax = axes[1, 1]
    if "grad_norm" in frame:
        ax.plot(epoch, frame["grad_norm"], marker=".", color="tab:red", label="grad norm")
    if "skipped_steps" in frame and (frame["skipped_steps"] > 0).any():
        skipped = frame[frame["skipped_steps"] > 0]
        ax.scatter(
            skipped["epoch"], skipped["grad_norm"], marker="x", color="k", zorder=3, label="epochs with skipped steps"
        )
        ax.legend(fontsize="small")
    ax.set_ylabel("gradient norm")
    ax.set_title("Gradient norm (before clipping)")

    for ax in axes[1]:
        ax.set_xlabel("epoch")
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"Training: {title}" if title else "Training")
    fig.tight_layout()
    _save(fig, out)
    return Path(out)
