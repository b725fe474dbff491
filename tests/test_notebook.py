"""notebooks/mnist_dbn.ipynb, executed end to end with nbclient on tiny parameters
(real MNIST from ../shared, a real mini-cluster of processes)."""

import base64
import io
import os
import re
from pathlib import Path

import matplotlib.image
import nbformat
import pytest
from nbclient import NotebookClient

from conftest import MNIST_DIR

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "mnist_dbn.ipynb"


@pytest.fixture
def mnist_files():
    from dbn.data import mnist

    if not all((MNIST_DIR / name).is_file() for name in mnist.MNIST_FILES):
        pytest.skip(f"real MNIST files not found in {MNIST_DIR}")


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """The name of a ``python3`` kernelspec that runs this interpreter (so the kernel imports this
    checkout's ``dbn``): written to a temporary directory that JUPYTER_PATH puts before any user
    or system kernelspec of the same name."""
    from ipykernel.kernelspec import write_kernel_spec

    jupyter = tmp_path / "jupyter"
    write_kernel_spec(jupyter / "kernels" / "python3")
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(p for p in (str(jupyter), os.environ.get("JUPYTER_PATH")) if p))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    return "python3"


def inject(nb, **values):
    """Papermill's way: a cell after the one tagged ``parameters`` that sets new values."""
    index = next(i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", []))
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))


def tagged(nb, tag):
    return next(cell for cell in nb.cells if tag in cell.metadata.get("tags", []))


def text(cell):
    return "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")


def images(cell):
    return [matplotlib.image.imread(io.BytesIO(base64.b64decode(out.data["image/png"])), format="png")
            for out in cell.outputs if "image/png" in out.get("data", {})]


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    assert "parameters" in code[0].metadata.get("tags", [])


def test_notebook_runs_end_to_end(tmp_path, mnist_files, kernel):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    out = tmp_path / "run"
    inject(nb, DATA_DIR=str(MNIST_DIR), WORKERS=2, LAYERS=(32,), TRAIN_IMAGES=1500, PRETRAIN_EPOCHS=2,
           FINETUNE_EPOCHS=3, VALIDATION=300, OUT=str(out))
    work = tmp_path / "work"
    work.mkdir()
    NotebookClient(nb, kernel_name=kernel, timeout=300, resources={"metadata": {"path": str(work)}}).execute()

    errors = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"]
    assert not errors, errors
    assert f"MNIST files: {MNIST_DIR}" in text(tagged(nb, "setup"))

    progress = text(tagged(nb, "train"))
    final_lines = [line.rsplit("\r", 1)[-1] for line in progress.split("\n")]  # what a notebook shows
    assert any(re.search(r"step +\d+/\d+  pretrain +layer 1/1  epoch +2/2  reconstruction error +\d", line)
               for line in final_lines), progress
    assert any(re.search(r"finetune +epoch +3/3  loss \S+  train err +\S+%  valid err +\S+%  \| .* syncing", line)
               for line in final_lines), progress
    assert re.search(r"done in [\d.]+ s: pre-training [\d.]+ s \(\d+% of it synchronising\)", progress), progress

    for tag in ("curves", "filters", "digits"):
        pictures = images(tagged(nb, tag))
        assert len(pictures) == 1, tag
        assert pictures[0].ndim == 3 and pictures[0].shape[0] > 100 and pictures[0].std() > 0.01, tag
    assert re.search(r"test error: \d+\.\d\d % on the 10,000 MNIST test images \(result.json\); \d+ of them",
                     text(tagged(nb, "digits")))
    assert {"model.npz", "log.jsonl", "result.json"} <= {p.name for p in out.iterdir()}
