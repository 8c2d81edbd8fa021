"""Shared test set-up: nbval ignores stderr (progress bars, warnings); fixtures load the model once."""

from __future__ import annotations

import os

# One thread per process: the model is tiny, and on a 2-core machine two processes with two
# threads each (pytest and a notebook kernel, say) stall each other badly. Notebook kernels that
# nbval starts inherit this, so stored and re-executed outputs come from the same arithmetic.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collectstart(collector) -> None:
    """nbval compares stderr by default; progress bars and library warnings are not facts."""
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)


@pytest.fixture(scope="session")
def tiny():
    """The shipped model and tokenizer, loaded once for the whole session."""
    from minikv.checkpoint import load_model

    torch.manual_seed(0)
    return load_model(device="cpu")


@pytest.fixture
def altered_checkpoint(tmp_path):
    """A copy of the shipped checkpoint in a tmp dir, its config.json changed and some files dropped."""
    import json
    import shutil

    from minikv.checkpoint import DEFAULT_MODEL_DIR

    def make(drop: tuple[str, ...] = (), **config_changes):
        path = tmp_path / "altered"
        shutil.copytree(DEFAULT_MODEL_DIR, path, ignore=shutil.ignore_patterns(*drop))
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, **config_changes}))
        return path

    return make
