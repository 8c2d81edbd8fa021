"""Load any local Hugging Face Llama checkpoint into minikv's model, and save ours as one.

Everything goes through `transformers` (config, weights, tokenizer), from a local directory:
nothing is fetched from a hub. A directory that is missing or not a Llama checkpoint gives a
`CheckpointError` that says what is wrong, never a traceback from deep inside a library.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from minikv.model import Llama, ModelConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = REPO_ROOT / "data" / "tiny-llama"


class CheckpointError(ValueError):
    """A model directory minikv cannot load; the message names the problem."""


def default_model_dir() -> Path:
    """$MINIKV_MODEL if set, else the tiny model shipped in data/."""
    return Path(os.environ.get("MINIKV_MODEL", DEFAULT_MODEL_DIR))


def pick_device(device: str | None = None) -> torch.device:
    """The device asked for, else CUDA when present, else the CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_hf_config(path: Path) -> LlamaConfig:
    """Read and check config.json of a local Llama checkpoint."""
    from transformers import AutoConfig

    if not path.is_dir():
        raise CheckpointError(f"model directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path} has no config.json: not a Hugging Face checkpoint")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:  # malformed JSON, unknown fields: report, don't crash
        raise CheckpointError(f"cannot read {path / 'config.json'}: {e}") from None
    if config.model_type != "llama":
        raise CheckpointError(f"{path} holds a {config.model_type!r} model; minikv runs Llama-family models only")
    return config


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot load a tokenizer from {path}: {e}") from None


def load_model(
    path: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Llama, PreTrainedTokenizerBase]:
    """Build minikv's Llama from a local checkpoint directory and return it with its tokenizer."""
    path = Path(path) if path is not None else default_model_dir()
    hf_config = load_hf_config(path)
    try:
        config = ModelConfig.from_hf(hf_config)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a startup log, not a progress bar
    try:
        hf_model = LlamaForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot load weights from {path}: {e}") from None
    model = Llama(config).to(dtype)
    model.load_state_dict(from_hf_state_dict(hf_model.state_dict(), config))
    model = model.to(pick_device(str(device) if device is not None else None)).eval()
    return model, load_tokenizer(path)


# minikv's packed weights and the transformers weights stacked into each, rows in this order.
PACKED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def from_hf_state_dict(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """transformers names ('model.layers.0...') -> minikv names ('layers.0...'), projections packed."""
    out = {k.removeprefix("model."): v for k, v in state.items()}
    for layer in range(config.num_layers):
        for packed, parts in PACKED.items():
            names = [f"layers.{layer}.{part}.weight" for part in parts]
            out[f"layers.{layer}.{packed}.weight"] = torch.cat([out.pop(n) for n in names])  # (sum of rows, in)
    if config.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def to_hf_state_dict(model: Llama) -> dict[str, torch.Tensor]:
    """minikv's weights under transformers' names, packed projections split back (the inverse of the above)."""
    c = model.config
    rows = {"self_attn.qkv_proj": [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim],
            "mlp.gate_up_proj": [c.intermediate_size, c.intermediate_size]}
    state = {}
    for name, weight in model.state_dict().items():
        packed = next((p for p in PACKED if name.endswith(f".{p}.weight")), None)
        if packed is None:
            state[name if name == "lm_head.weight" else f"model.{name}"] = weight
            continue
        prefix = name.removesuffix(f"{packed}.weight")
        for part, piece in zip(PACKED[packed], weight.split(rows[packed])):
            state[f"model.{prefix}{part}.weight"] = piece
    return state


def hf_config_for(config: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    """The transformers config that describes `config`."""
    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def to_hf_model(model: Llama, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A transformers LlamaForCausalLM holding exactly minikv's weights."""
    hf_model = LlamaForCausalLM(hf_config_for(model.config, tokenizer))
    missing, unexpected = hf_model.load_state_dict(to_hf_state_dict(model), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return hf_model.to(model.dtype).eval()


def save_checkpoint(model: Llama, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Write `model` and `tokenizer` with save_pretrained, loadable by AutoModelForCausalLM."""
    path = Path(path)
    hf_model = to_hf_model(model.cpu(), tokenizer)
    hf_model.generation_config.eos_token_id = tokenizer.eos_token_id
    hf_model.generation_config.pad_token_id = tokenizer.pad_token_id
    hf_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
