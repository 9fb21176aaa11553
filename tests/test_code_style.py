"""The repository passes its own linters: `ruff check` and `ruff format --check` (settings in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")  # the pinned test dependency installed next to this interpreter


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_passes(command):
    assert RUFF.exists(), f"ruff not found at {RUFF}; it is a test dependency: pip install -e '.[test]'"
    result = subprocess.run([str(RUFF), *command, "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, f"ruff {' '.join(command)} failed:\n{result.stdout}{result.stderr}"
