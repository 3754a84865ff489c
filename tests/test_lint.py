"""ruff (configured in pyproject.toml, pinned in the `test` extra): lint finds nothing and the tree is formatted."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff not installed (pip install -e '.[test]')")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout + result.stderr
