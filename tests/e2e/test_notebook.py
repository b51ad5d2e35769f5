"""examples/notebook.ipynb run in a real Jupyter kernel (nbclient): the documented API (docs/api.md) shows a
lesson's table, a memory breakdown and pictures there. The kernel runs this Python (ipykernel's own), so it
imports the parasim under test."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"


@pytest.fixture(scope="module")
def cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return [c for c in nb.cells if c.cell_type == "code"]


def shown(cell, kind: str) -> str:
    """What the cell displayed as `kind` (text/html, image/png, text/plain); '' where nothing; an error fails."""
    for out in cell.outputs:
        assert out.output_type != "error", "".join(out.get("traceback", []))
    return "".join(str(o.get("data", {}).get(kind, "")) for o in cell.outputs if o.output_type == "execute_result")


def test_the_lesson_shows_its_checks_and_table(cells):
    html = shown(cells[0], "text/html")
    assert "cp-causal" in html and "checks" in html and "Causal work per CP rank" in html
    frame = shown(cells[1], "text/html")
    assert "zigzag share %" in frame and "rank 0 (GPU 1)" in frame
    assert shown(cells[2], "image/png")


def test_the_memory_report_shows_its_items_and_bars(cells):
    html = shown(cells[3], "text/html")
    assert "27B dense" in html and "fits" in html and "optimizer" in html
    assert shown(cells[4], "text/plain") == "True"
    assert "weights" in shown(cells[5], "text/html")
    assert shown(cells[6], "image/png")
