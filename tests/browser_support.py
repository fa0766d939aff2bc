"""Helpers of the browser tests: a throw-away JupyterLab server and Debian's headless Chromium.

`JupyterLab` starts `python -m jupyter lab` from this interpreter (the project's .venv) on
127.0.0.1, a free port, a random token and a temporary root directory, with everything Jupyter
reads or writes (config, settings, workspaces, runtime files, kernelspecs, IPython profile) kept
inside a temporary directory, so that neither the user's setup nor an earlier run can change what
the tests see.  `stop()` shuts the server and its kernels down, and kills what is left.

`launch_chromium()` starts /usr/bin/chromium through Playwright (never a browser that
Playwright would download) with the flags this machine's closed network needs.

`Notebook` wraps a Playwright page showing one notebook: run all cells through the Run menu,
wait until every code cell has executed, find cells and their outputs.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    # Without these, Chromium's own background connections are refused by this machine's
    # closed network, which slows or breaks the start.
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1000}
KERNEL_NAME = "Python 3 (ipykernel)"     # display name of the kernelspec the server gets (as the
# tutorials store it: another name would mark them modified as soon as they are opened)

# JupyterLab user settings written for the test server: no news / update toasts over the page,
# and every cell kept in the DOM (no virtual "windowing"), so selectors see the whole notebook.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"checkForUpdates": False, "fetchNews": "false"},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
        {"windowingMode": "none"},
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def copy_notebook_without_outputs(src: Path, dst: Path) -> Path:
    """Copy a notebook with its outputs, execution counts and saved widget state removed.

    A fresh notebook shows `[ ]:` prompts, so "every code cell shows a number" proves that the
    cells ran in this session, and no saved (dead) widget can be mistaken for a live one.
    """
    nb = nbformat.read(str(src), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": KERNEL_NAME, "language": "python"}
    nbformat.write(nb, str(dst))
    return dst


def write_notebook(path: Path, cells: list[str]) -> Path:
    """A notebook of code cells (each a source string) for the python3 kernel."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": KERNEL_NAME, "language": "python"}
    nbformat.write(nb, str(path))
    return path


class JupyterLab:
    """A JupyterLab server for one test session; use as a context manager or call stop()."""

    def __init__(self, base: Path, start_timeout: float = 90.0):
        self.base = Path(base)
        self.root = self.base / "root"          # what the file browser shows
        self.home = self.base / "jupyter"       # config, data, runtime, settings, workspaces
        self.port = free_port()
        self.token = secrets.token_hex(24)
        self.log_path = self.base / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None
        self.start_timeout = start_timeout

    # --- setup ------------------------------------------------------------------------------
    def _prepare(self) -> dict:
        self.root.mkdir(parents=True, exist_ok=True)
        dirs = {name: self.home / name for name in
                ("config", "data", "runtime", "settings", "workspaces", "ipython")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        # The kernel: this interpreter (the .venv), whatever `python` on PATH or the user's
        # kernelspecs say.  JUPYTER_PATH comes first in the kernelspec search.
        spec_dir = dirs["data"] / "kernels" / "python3"
        spec_dir.mkdir(parents=True, exist_ok=True)
        (spec_dir / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": KERNEL_NAME,
            "language": "python",
        }, indent=1))
        for rel, value in LAB_SETTINGS.items():
            p = dirs["settings"] / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(value))
        env = dict(os.environ)
        for var in ("JUPYTER_CONFIG_PATH", "JUPYTER_PREFER_ENV_PATH", "JUPYTER_PLATFORM_DIRS"):
            env.pop(var, None)
        env.update({
            "JUPYTER_CONFIG_DIR": str(dirs["config"]),
            "JUPYTER_DATA_DIR": str(dirs["data"]),
            "JUPYTER_PATH": str(dirs["data"]),
            "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
            "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
            "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
            "IPYTHONDIR": str(dirs["ipython"]),
            "MPLBACKEND": "agg",
            "PYTHONUNBUFFERED": "1",
        })
        return env

    def _command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "jupyter", "lab",
            "--no-browser",
            "--ServerApp.open_browser=False",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",         # this port or fail: the URLs use it
            f"--ServerApp.root_dir={self.root}",
            f"--IdentityProvider.token={self.token}",
            # no news, no update checks, no "build recommended" prompts
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--ServerApp.terminals_enabled=False",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        return cmd

    def start(self, attempts: int = 3) -> "JupyterLab":
        env = self._prepare()
        atexit.register(self.stop)      # should the test session end without its teardown
        for attempt in range(attempts):
            self._log = open(self.log_path, "wb")
            # Its own process group: stop() can end the server and anything it started.
            self.proc = subprocess.Popen(self._command(), cwd=self.root, env=env, stdout=self._log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
            try:
                self._wait_ready()
                return self
            except RuntimeError:
                # Exited at once: most likely someone took the free port in the meantime.
                self.stop()
                if attempt + 1 == attempts or "in use" not in self.log_tail():
                    raise
                self.port = free_port()
            except BaseException:
                self.stop()
                raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.api_url("api/status"), timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.25)
        raise TimeoutError(f"jupyter lab did not answer within {self.start_timeout:.0f} s:\n{self.log_tail()}")

    # --- urls -------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def api_url(self, path: str) -> str:
        return f"{self.base_url}{path}?token={self.token}"

    def notebook_url(self, relpath: str, workspace: str) -> str:
        """The URL of a notebook opened in its own (empty) JupyterLab workspace."""
        return f"{self.base_url}lab/workspaces/{workspace}/tree/{relpath}?token={self.token}"

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    # --- teardown ---------------------------------------------------------------------------
    def _kernel_pids(self) -> list[int]:
        """Kernels started by this server: their command line names our private runtime dir."""
        marker = str(self.home / "runtime")
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            # Polite first: /api/shutdown stops the kernels and the server.
            try:
                req = urllib.request.Request(self.api_url("api/shutdown"), method="POST")
                urllib.request.urlopen(req, timeout=5).close()
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        if proc is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:
                    break
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            try:                  # whatever is left in the server's process group
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # Kernels run in sessions of their own; end any that outlived the server.
        for pid in (self._kernel_pids() if self.home.exists() else []):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        log = getattr(self, "_log", None)
        if log is not None and not log.closed:
            log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def launch_chromium(playwright, user_data_dir: Path):
    """A persistent Chromium context (fresh user-data dir) from Debian's /usr/bin/chromium."""
    user_data_dir = Path(user_data_dir)
    # Chromium's crash reports and caches go under XDG dirs: keep them in the temporary dir too.
    env = dict(os.environ, XDG_CONFIG_HOME=str(user_data_dir / "xdg-config"),
               XDG_CACHE_HOME=str(user_data_dir / "xdg-cache"))
    ctx = playwright.chromium.launch_persistent_context(
        str(user_data_dir / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
        env=env, viewport=VIEWPORT, device_scale_factor=1, locale="en-US", timezone_id="UTC")
    ctx.set_default_timeout(30_000)
    return ctx


# The state of "Run All": every code cell numbered (done), some still queued or running (running),
# or nothing queued any more although some cells never ran (stopped: a cell raised, and JupyterLab
# abandons the rest of the queue).
_RUN_STATE_JS = """
() => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
      .map(p => p.textContent.trim());
  if (prompts.length === 0) return 'running';
  if (prompts.some(t => t.includes('*'))) return 'running';
  if (prompts.every(t => /^\\[\\d+\\]:?$/.test(t))) return 'done';
  return prompts.some(t => /\\d/.test(t)) ? 'stopped' : 'running';
}
"""


class Notebook:
    """A page showing one notebook in JupyterLab."""

    def __init__(self, page, name: str):
        self.page = page
        self.name = name

    @classmethod
    def open(cls, context, lab: JupyterLab, relpath: str, workspace: str, timeout: float = 90_000):
        """Open `relpath` in a new page; return once all its cells are shown and its kernel is idle."""
        page = context.new_page()
        nb = cls(page, relpath)
        nb.n_cells = len(nbformat.read(str(lab.root / relpath), as_version=4).cells)
        page.goto(lab.notebook_url(relpath, workspace), wait_until="domcontentloaded", timeout=timeout)
        nb.wait_ready(timeout)
        # Hide the left sidebar (the file browser): the notebook, and the screenshots, get the width.
        if page.locator("#jp-left-stack:visible").count():
            page.keyboard.press("Control+b")
            page.locator("#jp-left-stack").wait_for(state="hidden")
        return nb

    def wait_ready(self, timeout: float = 90_000) -> None:
        """Every cell of the file is in the DOM and our kernel is connected and idle.

        (The toolbar's execution indicator says 'idle' even before a kernel exists, so the
        kernel name in the toolbar and the status bar's '<kernel> | Idle' are what count.)
        """
        self.page.wait_for_function(
            """([n, name]) => {
                const cells = document.querySelectorAll('.jp-Notebook .jp-Cell').length;
                const kernel = [...document.querySelectorAll('.jp-Toolbar-kernelName')]
                    .some(e => e.textContent.trim() === name);
                const idle = [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem')]
                    .some(e => /\\|\\s*Idle\\s*$/.test(e.textContent));
                return (cells === n && kernel && idle) || document.querySelector('.jp-Dialog') !== null;
            }""", arg=[self.n_cells, KERNEL_NAME], timeout=timeout, polling=200)
        dialog = self.page.locator(".jp-Dialog")
        if dialog.count():
            raise AssertionError(f"JupyterLab shows a dialog: {dialog.inner_text()!r}")

    def run_all(self, timeout: float = 120_000) -> float:
        """Run > Run All Cells; wait until every code cell has run.  Returns the seconds it took."""
        page = self.page
        t0 = time.monotonic()
        page.locator(".lm-MenuBar-item", has_text=re.compile(r"^\s*Run\s*$")).click()
        page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
        page.wait_for_function(f"() => ({_RUN_STATE_JS})() !== 'running'", timeout=timeout, polling=250)
        state = page.evaluate(f"({_RUN_STATE_JS})()")
        if state != "done":
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            raise AssertionError(f"Run All stopped before the end of {self.name}: "
                                 + " | ".join(errors.all_inner_texts())[-3000:])
        self.wait_ready(timeout)
        return time.monotonic() - t0

    def code_cell(self, containing: str):
        """The code cell whose source contains `containing` (exactly one must)."""
        cells = self.page.locator(".jp-Notebook .jp-CodeCell").filter(
            has=self.page.locator(".jp-InputArea-editor", has_text=containing))
        assert cells.count() == 1, f"{cells.count()} code cells contain {containing!r} in {self.name}"
        return cells.first

    def output_text(self, cell) -> str:
        return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())


def save_screenshot(target, path: Path) -> Path:
    """Screenshot a page or a locator into `path` (folders made as needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    target.screenshot(path=str(path))
    return path


def copy_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
