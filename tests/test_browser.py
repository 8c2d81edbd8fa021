"""The widgets in a real browser: JupyterLab in headless Chromium runs a notebook and Play moves.

Runs when /usr/bin/chromium and the `playwright` package are installed (CI installs both);
skipped otherwise. The notebook is tests/browser/widget_demo.ipynb unless $MINIKV_BROWSER_NOTEBOOK
names another; the screenshot goes to $MINIKV_SCREENSHOT or /tmp/minikv_browser_check.png.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = Path(os.environ.get("MINIKV_BROWSER_NOTEBOOK", ROOT / "notebooks" / "02_page_pools_and_block_tables.ipynb"))


def _browser_check():
    spec = importlib.util.spec_from_file_location("browser_check", ROOT / "scripts" / "browser_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def seen():
    """Run the browser check once; every test below reads what it saw."""
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium: apt-get install -y chromium to run the browser check")
    pytest.importorskip("playwright", reason="no playwright package: pip install playwright to run the browser check")
    return _browser_check().check(NOTEBOOK)


def test_slider_and_play_render(seen):
    """After Run All Cells the page shows a slider and a Play button."""
    assert seen.sliders >= 1 and seen.play_buttons >= 1


def test_page_map_renders_inside_and_outside_the_widget(seen):
    """The widget's page-map image and the still PNG beside it are both in the page."""
    assert seen.widget_images >= 1 and seen.static_images >= 1


def test_pressing_play_moves_the_readout(seen):
    """Play advances the slider in the browser."""
    assert seen.play_moved, f"readout stayed at {seen.readout_before!r}"


def test_screenshot_is_saved(seen):
    """The check leaves a screenshot where it said."""
    assert Path(seen.screenshot).read_bytes().startswith(b"\x89PNG")
