"""Shared test set-up: nbval ignores stderr (progress bars, warnings); fixtures load the model once."""

from __future__ import annotations

import pytest
import torch


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
