"""What `make lab` does before it starts JupyterLab on the tutorials and the gallery.

- JupyterLab's news and update toasts are turned off for this environment (a settings override
  in the .venv's `share/jupyter/lab/settings/overrides.json`, merged with what is there; the
  user's own settings are not touched): they would pop up over the first notebook.
- The tutorials and the gallery notebooks are trusted (signed in the user's Jupyter trust database, as `jupyter trust`
  does; the files are not changed): their stored explorer snapshots and graphs are HTML with
  inline SVG, which JupyterLab shows only in trusted notebooks.
"""
from __future__ import annotations

import json
import pathlib
import sys

import nbformat
from nbformat.sign import NotebookNotary

ROOT = pathlib.Path(__file__).resolve().parent.parent
QUIET = {"@jupyterlab/apputils-extension:notification": {"checkForUpdates": False, "fetchNews": "false"}}


def quiet_lab() -> pathlib.Path:
    path = pathlib.Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    current = json.loads(path.read_text()) if path.exists() else {}
    for plugin, values in QUIET.items():
        current.setdefault(plugin, {}).update(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(current, indent=2) + "\n")
    tmp.replace(path)                   # never a half-written settings file
    return path


def trust_tutorials() -> list[str]:
    notary = NotebookNotary()
    names = []
    for p in sorted((ROOT / "tutorials").glob("*.ipynb")) + sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(p, as_version=4)
        if not notary.check_signature(nb):
            notary.sign(nb)
        names.append(p.name)
    return names


def main() -> None:
    path = quiet_lab()
    names = trust_tutorials()
    print(f"[lab] news and update checks off ({path}); trusted: {', '.join(names)}")


if __name__ == "__main__":
    main()
