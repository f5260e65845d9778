"""notebooks/*.ipynb run headless (nbclient, a fresh kernel on CPU) and fail on any cell error."""
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    # The kernel imports composer_jax from the checkout even without `pip install -e .`.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    # The kernel is this interpreter (ipykernel's native spec), so it sees the same venv.
    client.kernel_manager_class = _native_kernel_manager(sys.executable)
    client.execute()                                 # raises CellExecutionError on any error
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "rejected at parse time" in text
    assert "MoE layer 0: tokens per expert" in text
    assert "stop: " in text and "reward" in text
    assert "rl_step metrics:" in text and "'update_skipped': 0.0" in text
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 2                           # the loss curve and the expert-load bars


def _native_kernel_manager(python: str):
    """A KernelManager that starts `python -m ipykernel_launcher` (not whatever kernelspec named
    python3 is installed on the machine)."""
    from jupyter_client.manager import KernelManager

    class Native(KernelManager):
        @property
        def kernel_spec(self):
            from jupyter_client.kernelspec import KernelSpec
            return KernelSpec(argv=[python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                              display_name="Python 3", language="python", resource_dir="")
    return Native
