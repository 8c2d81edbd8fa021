"""Shared test fixtures: the model, loaded once. (Threads and nbval's stderr: the root conftest.py.)"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny():
    """The shipped model and tokenizer, loaded once for the whole session."""
    from minikv.checkpoint import load_model

    torch.manual_seed(0)
    return load_model(device="cpu")
