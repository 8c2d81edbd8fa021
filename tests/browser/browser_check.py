"""Open a notebook in a real JupyterLab in headless Chromium, run it, and check that its widgets work.

    python tests/browser/browser_check.py [NOTEBOOK] [--screenshot PATH]

A copy without outputs or widget state runs in JupyterLab: a slider, a Play button and a page-map image must
appear, no still PNG beside a player, and Play must move the readout; then a screenshot. Needs /usr/bin/chromium
(or $MINIKV_CHROMIUM) and `pip install playwright` (never `playwright install`). Exit status 0 when all passed.
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from minikv.serve.launch import LocalServer, ServerProcess

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("MINIKV_CHROMIUM", "/usr/bin/chromium")
DEFAULT_NOTEBOOK = ROOT / "tests" / "browser" / "widget_demo.ipynb"
DEFAULT_SCREENSHOT = "/tmp/minikv_browser_check.png"
FAILURE_SCREENSHOT = "/tmp/minikv_browser_check_failed.png"
# Without the networking flags headless Chromium floods the log with refused connections.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NEWS_SETTINGS = ("@jupyterlab/apputils-extension", "notification.jupyterlab-settings",
                 {"fetchNews": "false", "checkForUpdates": False})
IDLE_KERNEL = ".jp-Notebook-ExecutionIndicator[data-status='idle']"
WIDGET_IMAGE = ".jp-OutputArea-output img.widget-image, .widget-output img"
STATIC_IMAGE = ".jp-RenderedImage img"  # a PNG output outside any widget
# a still PNG drawn in the same cell's outputs as a player: the player's own fallback must not show
STILLS_BESIDE_PLAYERS = ("() => [...document.querySelectorAll('.jp-OutputArea')].filter(a => a.querySelector('.widget-play'))"
                         ".reduce((n, a) => n + a.querySelectorAll('.jp-RenderedImage img').length, 0)")
CELL_RAN = "() => [...document.querySelectorAll('.jp-InputPrompt')].some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))"


@dataclass
class CheckResult:
    """What the browser saw."""

    notebook: str
    sliders: int
    play_buttons: int
    widget_images: int
    static_images: int
    stills_beside_players: int
    readout_before: str
    readout_after: str
    screenshot: str
    seconds: float  # the browser check itself
    warm_up_seconds: float  # the headless run before it

    @property
    def play_moved(self) -> bool:
        return self.readout_before != self.readout_after


def warm_up(notebook: Path) -> float:
    """Execute the notebook once headless, untimed (a fresh clone's first kernel builds caches for longer than
    the 60 s wait for the first widget); returns seconds."""
    import nbclient

    start = time.monotonic()
    nb = nbformat.read(notebook, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(notebook.parent)}}).execute()
    return time.monotonic() - start


def stripped_copy(notebook: Path) -> Path:
    """A copy beside the original (same folder, so relative paths still work) with no outputs."""
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    copy = notebook.with_name(f"_browser_check_{notebook.name}")
    nbformat.write(nb, copy)
    return copy


class JupyterLab(ServerProcess):
    """JupyterLab on a free loopback port serving `root`, all its state under `scratch`; stopped with its kernels."""

    name, ready_path = "JupyterLab", "/api/status"

    def __init__(self, root: Path, scratch: Path) -> None:
        LocalServer.__init__(self, None)  # not ServerProcess's: the command is JupyterLab's
        settings = scratch / "settings"
        folder, name, values = NEWS_SETTINGS
        (settings / folder).mkdir(parents=True)
        (settings / folder / name).write_text(json.dumps(values))
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(settings),
                   JUPYTERLAB_WORKSPACES_DIR=str(scratch / "workspaces"), JUPYTER_RUNTIME_DIR=str(scratch / "runtime"))
        command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                   f"--port={self.port}", "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}"]
        # in a session of its own: ServerProcess.stop ends it, then any kernel it left behind in that session
        self.start(command, env, open(scratch / "jupyterlab.log", "w+"), new_session=True)


def expect(page, selector: str, what: str, timeout_ms: float) -> None:
    """Wait for `selector`; fail with a sentence naming what never appeared."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(selector, timeout=timeout_ms)
    except PlaywrightTimeout:
        shot = FAILURE_SCREENSHOT
        page.screenshot(path=shot, full_page=True)  # what the page showed instead
        raise AssertionError(f"{what} never appeared in the page ({selector!r}, {timeout_ms / 1000:.0f} s);"
                             f" the page as it was: {shot}") from None


def accept_dialog(page) -> str | None:
    """A JupyterLab dialog (a kernel to choose, a file changed on disk) blocks every click beneath it: take its
    default answer; what it asked, or None if there was none."""
    dialog = page.query_selector(".jp-Dialog")
    if dialog is None:
        return None
    asked = " ".join(dialog.inner_text().split())[:300]
    print(f"JupyterLab asked: {asked!r}; taking its default", file=sys.stderr)
    page.click(".jp-Dialog .jp-mod-accept", timeout=10_000)
    return asked


def run_all_cells(page, attempts: int = 4, started_ms: float = 30_000) -> None:
    """Run > Run All Cells, clicked again until a cell shows it ran ([*] or [1]): a click before the panel is
    active does nothing, even after it is drawn on a loaded machine. A dialog's answer may start a new kernel
    (JupyterLab asks for one when Run All finds none connected): wait for it to be idle before clicking again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    asked = []
    for _ in range(attempts):
        try:
            if (question := accept_dialog(page)) is not None:
                asked.append(question)
                page.wait_for_selector(IDLE_KERNEL, timeout=started_ms)
            page.click(".jp-NotebookPanel .jp-Cell >> nth=0", timeout=started_ms)  # Run All needs the panel active
            page.click(".lm-MenuBar-itemLabel:text-is('Run')", timeout=started_ms)
            page.click(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel:text-is('Run All Cells')",
                       timeout=started_ms)
            page.wait_for_function(CELL_RAN, timeout=started_ms)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"Run All Cells started no cell in {attempts} tries of {started_ms / 1000:.0f} s; "
                         f"JupyterLab's dialogs: {asked or 'none'}")


def loaded_images(page, selector: str, timeout_ms: float) -> int:
    """Wait up to `timeout_ms` for an image matching `selector` with pixels; how many have them."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function("sel => [...document.querySelectorAll(sel)].some(i => i.complete && i.naturalWidth > 0)",
                               arg=selector, timeout=timeout_ms)
    except PlaywrightTimeout:
        pass
    return page.eval_on_selector_all(selector, "images => images.filter(i => i.complete && i.naturalWidth > 0).length")


def run_in_browser(url: str, screenshot: str, timeout_s: float, first_timeout_s: float) -> dict:
    """Open `url`, Run All Cells, check the widgets, press Play, take the screenshot; the first widget gets
    `first_timeout_s`, each later wait `timeout_s`."""
    from playwright.sync_api import sync_playwright

    ms, first_ms = timeout_s * 1000, first_timeout_s * 1000
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, timeout=first_ms)
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=first_ms)
            page.wait_for_selector(IDLE_KERNEL, timeout=first_ms)
            run_all_cells(page)
            expect(page, ".widget-slider .widget-readout", "a slider widget", first_ms)
            expect(page, ".widget-play button", "a Play button", ms)
            expect(page, WIDGET_IMAGE, "a page-map image inside the widget", ms)
            expect(page, STATIC_IMAGE, "a PNG output outside the widget", ms)
            expect(page, IDLE_KERNEL, "an idle kernel after Run All", ms)
            # counted before Play: while it plays, the widget swaps its image every frame
            widget_images, static_images = loaded_images(page, WIDGET_IMAGE, ms), loaded_images(page, STATIC_IMAGE, ms)
            stills_beside_players = page.evaluate(STILLS_BESIDE_PLAYERS)
            readout = page.locator(".widget-slider .widget-readout").first
            before = readout.inner_text()
            page.locator(".widget-play button").first.click()  # the first button is Play
            deadline = time.monotonic() + 10
            while readout.inner_text() == before and time.monotonic() < deadline:
                page.wait_for_timeout(100)
            after = readout.inner_text()
            page.wait_for_timeout(600)  # let the kernel draw the new frame before the screenshot
            page.locator(".widget-slider").first.scroll_into_view_if_needed()
            page.screenshot(path=screenshot)
            return {
                "sliders": page.locator(".widget-slider").count(),
                "play_buttons": page.locator(".widget-play button").count(),
                "widget_images": widget_images,
                "static_images": static_images,
                "stills_beside_players": stills_beside_players,
                "readout_before": before, "readout_after": after,
            }
        finally:
            browser.close()


def check(notebook: Path = DEFAULT_NOTEBOOK, screenshot: str | None = None, timeout_s: float = 60,
          first_timeout_s: float = 180, warm: bool = True) -> CheckResult:
    """Run the whole check on `notebook`; returns what was seen (asserting nothing itself)."""
    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    notebook = Path(notebook).resolve()
    screenshot = screenshot or os.environ.get("MINIKV_SCREENSHOT") or DEFAULT_SCREENSHOT
    warm_up_seconds = round(warm_up(notebook), 1) if warm else 0.0
    # SIGTERM (tests/conftest.py's, at the end of a run) stops JupyterLab as Ctrl-C does; set only now, because the
    # warm-up's kernel manager resets it
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    start = time.monotonic()
    copy = stripped_copy(notebook)
    try:
        with tempfile.TemporaryDirectory(prefix="minikv-lab-") as scratch, JupyterLab(copy.parent, Path(scratch)) as lab:
            try:
                seen = run_in_browser(f"{lab.url}/lab/tree/{copy.name}", screenshot, timeout_s, first_timeout_s)
            except Exception as e:  # JupyterLab's log, then the failure (the test quotes stderr's tail)
                print(lab.output()[-2000:], f"\nbrowser check failed: {type(e).__name__}: {e}", file=sys.stderr)
                raise
    finally:
        copy.unlink(missing_ok=True)
    return CheckResult(str(notebook), screenshot=screenshot, seconds=round(time.monotonic() - start, 1),
                       warm_up_seconds=warm_up_seconds, **seen)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="?", type=Path, default=DEFAULT_NOTEBOOK)
    parser.add_argument("--screenshot", default=None, help=f"PNG to write (default $MINIKV_SCREENSHOT or {DEFAULT_SCREENSHOT})")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for each later thing to appear")
    parser.add_argument("--first-timeout", type=float, default=180, help="seconds to wait for the first widget")
    parser.add_argument("--no-warm-up", action="store_true", help="skip the headless run before the browser")
    args = parser.parse_args()
    result = check(args.notebook, args.screenshot, args.timeout, args.first_timeout, warm=not args.no_warm_up)
    print(json.dumps(asdict(result) | {"play_moved": result.play_moved}, indent=2))
    ok = (result.sliders and result.play_buttons and result.widget_images and result.static_images
          and not result.stills_beside_players and result.play_moved)
    print("browser check passed" if ok else "browser check FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
