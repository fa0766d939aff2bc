"""Re-execute the tutorials and the gallery so their stored outputs are the new truth (`make tutorials`).

    python scripts/run_tutorials.py                         # tutorials/ and notebooks/
    python scripts/run_tutorials.py 03_tiling.ipynb         # one tutorial
    python scripts/run_tutorials.py notebooks/stencil.ipynb # one gallery notebook (a path)

After a change to the compiler or simulator output, run this, then read `git diff tutorials/`:
every changed number should be one you expect.  Volatile metadata (execution timestamps) is
dropped so that the diff shows only what the notebooks print.
"""
from __future__ import annotations

import os
import pathlib
import sys

import nbformat
from nbclient import NotebookClient

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from conftest import REPRODUCIBLE  # noqa: E402  (the CPU kernels nbval checks the outputs with)

os.environ.update(REPRODUCIBLE)     # the notebook kernels started below inherit it
ROOT = REPO / "tutorials"
GALLERY = REPO / "notebooks"


def kernelspec() -> dict:
    """The notebook metadata JupyterLab writes for the python3 kernel of this environment: a
    tutorial stored with another display name is marked modified as soon as it is opened."""
    from jupyter_client.kernelspec import KernelSpecManager
    spec = KernelSpecManager().get_kernel_spec("python3")
    return {"display_name": spec.display_name, "language": spec.language, "name": "python3"}


def run(path: pathlib.Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = kernelspec()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)
    print(f"executed {path.name}")


def main(names: list[str]) -> None:
    if names:
        paths = [pathlib.Path(n).resolve() if ("/" in n or pathlib.Path(n).exists()) else ROOT / n for n in names]
    else:
        paths = sorted(ROOT.glob("[0-9][0-9]_*.ipynb")) + sorted(GALLERY.glob("*.ipynb"))
    for p in paths:
        run(p)


if __name__ == "__main__":
    main(sys.argv[1:])
