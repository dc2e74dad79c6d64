"""Execute the notebooks at CI size (FASTDIFF_NOTEBOOK_SMALL=1) with the current interpreter's kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stripped(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"{path.name}: commit notebooks without outputs"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_small(path, monkeypatch, tmp_path):
    monkeypatch.setenv("FASTDIFF_NOTEBOOK_SMALL", "1")
    # what a notebook writes goes where pytest cleans up, not into a folder of its own in /tmp
    monkeypatch.setenv("FASTDIFF_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv(
        "OMP_NUM_THREADS", "1"
    )  # the kernel inherits it; oversubscribed threads crawl on shared CI
    nb = nbformat.read(path, as_version=4)
    # kernel "python3": jupyter_client resolves it to ipykernel on this interpreter (native kernel)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    if "sweep(" in "".join(c.source for c in nb.cells):
        assert (tmp_path / "rows.json").exists(), "a notebook's sweep should write into FASTDIFF_NOTEBOOK_OUT"
    assert os.environ["FASTDIFF_NOTEBOOK_SMALL"] == "1"
