"""Shared test fixtures: the model, loaded once. (Threads and nbval's stderr: the root conftest.py.)"""

from __future__ import annotations

import pytest
import torch


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
