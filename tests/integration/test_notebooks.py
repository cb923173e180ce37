"""The acceptance notebook executes end to end on CPU in a Jupyter kernel (nbclient, the shipped pair, layers stacked),
with no cell raising. The quickstart notebook, on the real model, runs with the docs' examples, whose loads and
compiled programs it shares (tests/integration/test_examples.py)."""

import pytest
from helpers import ROOT

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = ROOT / "notebooks"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["acceptance.ipynb"])
def test_notebook_runs(name, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_LAYERS", "stacked")  # a third of the compile time at the same decoding speed
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "α" in text and "backend" in text
