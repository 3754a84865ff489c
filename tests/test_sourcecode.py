"""Each stage's code inputs are what its script imports: found statically, checked against a real import."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kws.sourcecode import code_digest, imported_files

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.py"))

# What a script loads when it runs far enough to parse its arguments: kws modules in sys.modules.
RUNTIME_IMPORTS = """
import json, runpy, sys
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
files = sorted(m.__file__ for name, m in list(sys.modules.items())
               if (name == "kws" or name.startswith("kws.")) and getattr(m, "__file__", None))
print(json.dumps(files))
"""


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_module_a_script_loads_is_in_its_code_inputs(name):
    result = subprocess.run(
        [sys.executable, "-c", RUNTIME_IMPORTS, str(REPO / "scripts" / name)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = {str(Path(f).resolve().relative_to(REPO)) for f in json.loads(result.stdout.splitlines()[-1])}
    assert loaded, f"{name} loads no kws module at all?"
    assert loaded <= set(imported_files(REPO / "scripts" / name, root=REPO))


def test_function_level_and_relative_imports_are_followed():
    train = imported_files(REPO / "scripts" / "train.py", root=REPO)
    # kws.loss and kws.model are imported inside a function; kws.model imports its parts relatively.
    for module in (
        "kws/trainer.py",
        "kws/loss.py",
        "kws/distributed.py",
        "kws/config.py",
        "kws/model/__init__.py",
        "kws/model/backbones.py",
        "kws/model/classifier.py",
    ):
        assert module in train
    assert "kws/det.py" not in train and "kws/synth/corpus.py" not in train


def test_every_rule_declares_the_imports_of_every_script_it_runs():
    """A rule that runs scripts/x.py declares code_of("x.py", ...) with each script it runs, and no
    hand-written list of modules."""
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = smk.read_text()
        for rule in re.split(r"\n(?=\s*rule[ :])", text):
            scripts = re.findall(r'script\("([a-z_]+\.py)"\)', rule)
            if not scripts:
                continue
            declared = re.findall(r"code=code_of\(([^)]*)\)", rule)
            assert len(declared) == 1, f"{smk.name}: a rule running {scripts} declares no code_of(...)"
            assert sorted(re.findall(r'"([a-z_]+\.py)"', declared[0])) == sorted(scripts), smk.name
        assert "code=code(" not in text, f"{smk.name}: hand-written code inputs"


def test_code_digest_follows_content_not_location(tmp_path):
    files = imported_files(REPO / "scripts" / "train.py", root=REPO)
    copy = tmp_path / "elsewhere"
    for name in files:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes((REPO / name).read_bytes())
    assert code_digest(files, root=copy) == code_digest(files, root=REPO)
    (copy / "kws" / "loss.py").write_text((REPO / "kws" / "loss.py").read_text() + "\n# edited\n")
    assert code_digest(files, root=copy) != code_digest(files, root=REPO)


def test_no_import_circles_between_kws_modules():
    """No kws module imports (at the top or in a function) one that imports it back, directly or not."""
    from graphlib import CycleError, TopologicalSorter

    from kws.sourcecode import _imported_names, _module_file, _module_name

    graph = {}
    for path in sorted((REPO / "kws").rglob("*.py")):
        own = _module_name(path, REPO)
        names = [name for name in _imported_names(path, REPO) if name.startswith("kws")]
        modules = {name for name in names if _module_file(name, REPO) is not None}
        # `from kws.x import y`: kws.x.y when y is a module, else kws.x (not both: kws.synth's __init__
        # importing kws.synth.corpus is no circle with corpus's `from kws.synth import augment`)
        objects = {name.rpartition(".")[0] for name in names if name not in modules}
        graph[own] = {
            name for name in modules if name in objects or not any(other.startswith(name + ".") for other in modules)
        } - {own}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        pytest.fail(f"import circle: {' -> '.join(err.args[1])}")
