"""Loading a checkpoint: config.json and the weights must agree, and every refusal is one line."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from minikv.model.checkpoint import (DEFAULT_MODEL_DIR, HF_FIELDS, CheckpointError, hf_config_for, load_model,
                               model_config_from_hf)


@pytest.mark.parametrize("changes, reason", [
    (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer, got 0"),
    (dict(num_hidden_layers=2), "config.json says num_hidden_layers=2 but the weights hold 4 layers"),
    (dict(num_hidden_layers=6), "config.json says num_hidden_layers=6 but the weights hold 4 layers"),
    (dict(hidden_size=128), "model.embed_tokens.weight is (99, 192) in the weights but config.json implies (99, 128)"),
    (dict(intermediate_size=256), "is (192, 512) in the weights but config.json implies (192, 256)"),
    (dict(vocab_size=50), "the tokenizer has 99 tokens but config.json says vocab_size=50"),
    (dict(tie_word_embeddings=False), "the weights lack lm_head.weight"),
])
def test_config_that_disagrees_with_the_weights_is_refused_in_one_line(altered_checkpoint, changes, reason):
    """A config.json that does not describe the weights is refused, naming what disagrees, in one line."""
    with pytest.raises(CheckpointError) as e:
        load_model(altered_checkpoint(**changes), device="cpu")
    assert reason in str(e.value) and "\n" not in str(e.value)


def test_special_token_id_outside_the_vocabulary_is_one_line(altered_checkpoint):
    """A pad_token_id past vocab_size is named, not an assertion from inside torch."""
    with pytest.raises(CheckpointError, match=r"pad_token_id 120 is outside the vocabulary \(vocab_size=99\)") as e:
        load_model(altered_checkpoint(pad_token_id=120), device="cpu")
    assert "\n" not in str(e.value)


def test_missing_tokenizer_is_one_line(altered_checkpoint):
    """A checkpoint without tokenizer files says so in one line."""
    with pytest.raises(CheckpointError, match="has no tokenizer: none of tokenizer.json") as e:
        load_model(altered_checkpoint(drop=("tokenizer*",)), device="cpu")
    assert "\n" not in str(e.value)


def test_missing_weights_is_one_line(altered_checkpoint):
    """A checkpoint without weights says it cannot load them, in one line."""
    with pytest.raises(CheckpointError, match="cannot load weights from") as e:
        load_model(altered_checkpoint(drop=("*.safetensors",)), device="cpu")
    assert "\n" not in str(e.value)


def test_field_map_round_trips(tiny):
    """minikv -> transformers -> minikv through HF_FIELDS gives back the same ModelConfig."""
    model, tok = tiny
    assert model_config_from_hf(hf_config_for(model.config, tok)) == model.config


def test_field_map_reads_the_shipped_config_json():
    """Every HF_FIELDS entry reads the transformers name found in the shipped config.json."""
    hf = AutoConfig.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    config = model_config_from_hf(hf)
    for ours, theirs in HF_FIELDS.items():
        assert getattr(config, ours) == getattr(hf, theirs), (ours, theirs)
