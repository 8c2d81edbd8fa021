"""Training is reproducible from its seed: the same seed gives the same weights, bit for bit."""

from __future__ import annotations

import torch

from minikv.training.train import TrainConfig, train

FEW_STEPS = dict(induction_steps=2, copy_steps=2, leak_steps=2, polish_steps=2, warmup_steps=2, batch_size=4)


def weights(seed: int, out) -> dict[str, torch.Tensor]:
    model = train(TrainConfig(seed=seed, **FEW_STEPS), out, progress=False)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    a, b = weights(0, tmp_path / "a"), weights(0, tmp_path / "b")
    c = weights(1, tmp_path / "c")
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "same seed, different weights"
    assert not all(torch.equal(a[k], c[k]) for k in a), "the seed changes nothing"
