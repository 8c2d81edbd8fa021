"""Shared test fixtures: the model, loaded once; and the slow set-ups started early. (Threads and nbval's stderr:
the root conftest.py.)"""

from __future__ import annotations

import subprocess

import pytest
import torch

STARTED_EARLY = pytest.StashKey[dict]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Once collection has settled which tests run, call `start_early()` in each test module that has one (a server
    that takes a minute to start: vLLM, JupyterLab), and move those modules' tests to the end of tests/, before the
    notebooks, so that the start runs in a process of its own while the other tests run."""
    modules = {getattr(item, "module", None) for item in items}
    start = not config.option.collectonly
    config.stash[STARTED_EARLY] = {m.__name__: start and m.start_early() for m in modules if hasattr(m, "start_early")}
    starts_early = [hasattr(getattr(item, "module", None), "start_early") for item in items]
    late = [item for item, early in zip(items, starts_early) if early]
    rest = [item for item, early in zip(items, starts_early) if not early]
    notebooks = next((k for k, item in enumerate(rest) if item.path.parent.name == "notebooks"), len(rest))
    items[:] = rest[:notebooks] + late + rest[notebooks:]


def pytest_sessionfinish(session) -> None:
    """Stop whatever was started early and never taken (its tests skipped or failed first): SIGTERM, which each
    of them answers by stopping its own servers."""
    for process in session.config.stash.get(STARTED_EARLY, {}).values():
        if isinstance(process, subprocess.Popen) and process.poll() is None:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="module")
def started_early(request):
    """What this module's `start_early()` started (None if nothing): each module takes its own once."""
    return request.config.stash.get(STARTED_EARLY, {}).pop(request.module.__name__, None)


@pytest.fixture(scope="session")
def tiny():
    """The shipped model and tokenizer, loaded once for the whole session."""
    from minikv.model.checkpoint import load_model

    torch.manual_seed(0)
    return load_model(device="cpu")


@pytest.fixture
def altered_checkpoint(tmp_path):
    """A copy of the shipped checkpoint in a tmp dir, its config.json changed and some files dropped."""
    import json
    import shutil

    from minikv.model.checkpoint import DEFAULT_MODEL_DIR

    def make(drop: tuple[str, ...] = (), **config_changes):
        path = tmp_path / "altered"
        shutil.copytree(DEFAULT_MODEL_DIR, path, ignore=shutil.ignore_patterns(*drop))
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, **config_changes}))
        return path

    return make
