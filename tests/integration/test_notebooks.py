"""Both notebooks execute end to end on CPU (nbclient, the shipped pair, layers stacked), with no cell raising."""

import os

import pytest
from helpers import ROOT, TEST_XLA_FLAGS

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = ROOT / "notebooks"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["quickstart.ipynb", "acceptance.ipynb"])
def test_notebook_runs(name, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSPEC_LAYERS", "stacked")  # a third of the compile time at the same decoding speed
    if name == "quickstart.ipynb":  # SmolLM2 decodes 3x slower unoptimised: XLA's defaults (helpers.TEST_XLA_FLAGS)
        flags = os.environ.get("XLA_FLAGS", "")
        for flag in TEST_XLA_FLAGS.split():
            flags = flags.replace(flag, "")
        monkeypatch.setenv("XLA_FLAGS", flags.strip())
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "α" in text and "backend" in text
