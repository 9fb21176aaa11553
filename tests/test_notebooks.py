"""The notebooks: committed without outputs, thin (public API only), and executed end to end with small settings.

Execution runs each notebook in a fresh kernel from this Python environment (`jupyter_client` starts the
`python3` kernel spec with `sys.executable`) with `EAGLE3_NOTEBOOK_SMALL=1`, as CI does. The quickstart and the
acceptance analysis need the head shipped in `model_cards/` (or `EAGLE3_NOTEBOOK_HEAD=<folder>`); a missing head
fails the test with the folder's name instead of skipping it.
"""

import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest

from eagle3_hf.loading import DEFAULT_HEAD_DIR


NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = ["01_quickstart.ipynb", "02_train_a_head.ipynb", "03_acceptance_analysis.ipynb"]
NEEDS_HEAD = {"01_quickstart.ipynb", "03_acceptance_analysis.ipynb"}
# Figures each notebook must draw (image/png outputs), so a plot that silently stops rendering fails.
MIN_FIGURES = {"01_quickstart.ipynb": 2, "02_train_a_head.ipynb": 1, "03_acceptance_analysis.ipynb": 3}
CELL_TIMEOUT_S = 600
# Library code belongs in eagle3_hf: notebooks call it, they define no functions or classes.
DEFINITION = re.compile(r"^\s*(def|class|async\s+def)\s|\blambda\b", re.MULTILINE)


def read(name: str):
    return nbformat.read(NOTEBOOKS_DIR / name, as_version=4)


def test_the_three_notebooks_are_there():
    assert sorted(path.name for path in NOTEBOOKS_DIR.glob("*.ipynb")) == NOTEBOOKS
    assert (NOTEBOOKS_DIR / "README.md").is_file()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_clean_with_a_parameters_cell(name):
    notebook = read(name)
    nbformat.validate(notebook)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    parameters = code_cells[0]
    assert "parameters" in parameters.metadata.get("tags", []), f"{name}: the first code cell must be tagged"
    assert 'os.environ.get("EAGLE3_NOTEBOOK_SMALL") == "1"' in parameters.source
    for index, cell in enumerate(code_cells):
        assert cell.outputs == [] and cell.execution_count is None, f"{name}: code cell {index} has outputs"
        assert not DEFINITION.search(cell.source), f"{name}: code cell {index} defines library logic"
    assert notebook.metadata.kernelspec.name == "python3"


def _head_for(name: str) -> str | None:
    """The head the notebook will load, failing clearly when it is missing."""
    if name not in NEEDS_HEAD:
        return None
    head = os.environ.get("EAGLE3_NOTEBOOK_HEAD")
    if head is None and not DEFAULT_HEAD_DIR.is_dir():
        pytest.fail(
            f"{name} needs the head shipped with the repository, but {DEFAULT_HEAD_DIR} is missing; add it, or set "
            "EAGLE3_NOTEBOOK_HEAD=<head folder> to run the notebook with another head."
        )
    if head is not None and not Path(head).is_dir():
        pytest.fail(
            f"EAGLE3_NOTEBOOK_HEAD={head} is not a folder; {name} needs an EAGLE-3 head folder (tests are offline)."
        )
    return head or str(DEFAULT_HEAD_DIR)


def _images(notebook) -> int:
    return sum(
        1
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    )


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_with_small_settings(name, tmp_path, monkeypatch):
    from nbclient import NotebookClient

    head = _head_for(name)
    if head is not None:
        monkeypatch.setenv("EAGLE3_NOTEBOOK_HEAD", head)
    monkeypatch.setenv("EAGLE3_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("EAGLE3_NOTEBOOK_OUTPUT", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    # As in conftest: one thread is faster on shared cores (two threads contending with other jobs are 5x slower).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = read(name)
    # Which Python ran the notebook: it must be this environment's, with this checkout's eagle3_hf.
    notebook.cells.append(
        nbformat.v4.new_code_cell("import sys, eagle3_hf; print(sys.executable, eagle3_hf.__file__)")
    )
    client = NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError with the failing cell and traceback
    print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    printed = "".join(output["text"] for output in notebook.cells[-1].outputs if output.get("name") == "stdout")
    executable, package = printed.split()
    assert (Path(executable).resolve(), Path(package).parent) == (
        Path(sys.executable).resolve(),
        NOTEBOOKS_DIR.parent / "eagle3_hf",
    )
    assert _images(notebook) >= MIN_FIGURES[name]
    if name == "02_train_a_head.ipynb":
        upload = tmp_path / "02_train_a_head" / "upload"
        assert sorted(path.name for path in upload.iterdir()) == ["README.md", "config.json", "model.safetensors"]
        card = (upload / "README.md").read_text(encoding="utf-8")
        assert "notebooks/02_train_a_head.ipynb (EAGLE3_NOTEBOOK_SMALL=1)" in card  # training and results recorded
