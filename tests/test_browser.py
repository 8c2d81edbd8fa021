"""The widgets in a real browser: JupyterLab in headless Chromium runs a notebook and Play moves.

The notebook opened is notebooks/02_page_pools_and_block_tables.ipynb (its page-map player),
unless $MINIKV_BROWSER_NOTEBOOK names another; the screenshot goes to $MINIKV_SCREENSHOT or
/tmp/minikv_browser_check.png. Needs /usr/bin/chromium (or $MINIKV_CHROMIUM) and the `playwright`
package: without them the tests are skipped on a developer's machine, and fail under CI=true,
where a missing browser means the check never ran.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = Path(os.environ.get("MINIKV_BROWSER_NOTEBOOK", ROOT / "notebooks" / "02_page_pools_and_block_tables.ipynb"))
CHROMIUM = os.environ.get("MINIKV_CHROMIUM", "/usr/bin/chromium")  # read as tests/browser/browser_check.py reads it


def missing_browser_parts(chromium: str) -> list[str]:
    """What the browser check needs and this machine lacks, each with the command that installs it."""
    missing = [] if Path(chromium).exists() else [f"no {chromium} (apt-get install -y chromium)"]
    if importlib.util.find_spec("playwright") is None:
        missing.append("no playwright package (pip install playwright)")
    return missing


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def start_check() -> subprocess.Popen | None:
    """tests/browser/browser_check.py on NOTEBOOK in a process of its own, its output to files; None if the browser
    is missing. Started when its tests run, never at collection beside the rest of the suite: on two busy cores
    JupyterLab lost its kernel's connection and asked for a kernel at every Run All (two CI runs)."""
    if missing_browser_parts(CHROMIUM):
        return None
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "browser" / "browser_check.py"), str(NOTEBOOK)],
                               stdout=out, stderr=err, text=True, cwd=ROOT)
    process.out, process.err = out, err
    return process


@pytest.fixture(scope="module")
def seen():
    """The browser check, run once, alone (the tests before it have ended); every test below reads what it saw."""
    missing = missing_browser_parts(CHROMIUM)
    if missing and on_ci():
        pytest.fail(f"CI=true but the browser check cannot run: {'; '.join(missing)}", pytrace=False)
    if missing:
        pytest.skip(f"browser check skipped: {'; '.join(missing)}")
    process = start_check()
    process.wait(900)
    process.out.seek(0), process.err.seek(0)
    out = process.out.read()
    if "{" not in out:
        pytest.fail(f"the browser check ended with status {process.returncode}:\n{process.err.read()[-3000:]}")
    return SimpleNamespace(**json.loads(out[: out.rindex("}") + 1]))


def run_browser_tests_without_chromium(ci: str) -> subprocess.CompletedProcess:
    """This file's first browser test in a child pytest that is told Chromium is elsewhere; a bare pytest (no
    conftest, no nbval or hypothesis plugin), since the test needs none of them."""
    env = dict(os.environ, CI=ci, MINIKV_CHROMIUM="/nonexistent/chromium")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--noconftest",
               "-p", "no:nbval", "-p", "no:hypothesispytest", f"{__file__}::test_slider_and_play_render"]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_missing_chromium_fails_under_ci():
    """With CI=true a missing browser is a failure naming what to install, not a silent skip."""
    done = run_browser_tests_without_chromium("true")
    assert done.returncode != 0, done.stdout
    assert "1 error" in done.stdout and "no /nonexistent/chromium (apt-get install -y chromium)" in done.stdout


def test_missing_chromium_skips_off_ci():
    """Without CI the same run skips, saying why."""
    done = run_browser_tests_without_chromium("")
    assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout


def test_slider_and_play_render(seen):
    """After Run All Cells the page shows a slider and a Play button."""
    assert seen.sliders >= 1 and seen.play_buttons >= 1


def test_page_map_renders_inside_and_outside_the_widget(seen):
    """The widget's page-map image and the notebook's page-map PNGs are both in the page."""
    assert seen.widget_images >= 1 and seen.static_images >= 1


def test_a_player_shows_one_picture_not_a_still_beneath_it(seen):
    """JupyterLab draws the live player only: its fallback still is not drawn in the same output."""
    assert seen.stills_beside_players == 0


def test_pressing_play_moves_the_readout(seen):
    """Play advances the slider in the browser."""
    assert seen.play_moved, f"readout stayed at {seen.readout_before!r}"


def test_screenshot_is_saved(seen):
    """The check leaves a screenshot where it said."""
    assert Path(seen.screenshot).read_bytes().startswith(b"\x89PNG")
