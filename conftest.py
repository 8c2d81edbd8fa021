"""Set-up for every pytest run, whether it collects tests/, notebooks/ or one notebook alone.

One thread per process: the model is tiny, and on a 2-core machine two processes with two
threads each (pytest and a notebook kernel, say) stall each other badly (a notebook run alone
under nbval on a busy machine took four times as long with two threads). Notebook kernels that
nbval starts inherit this, so stored and re-executed outputs come from the same arithmetic.
This file sits at the repository root so that `pytest notebooks/05_the_leak.ipynb` gets it too.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collectstart(collector) -> None:
    """nbval compares stderr by default; progress bars and library warnings are not facts."""
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)
