"""Load any local Hugging Face Llama checkpoint into minikv's model, and save ours as one: through
`transformers` (config, weights, tokenizer), from a local directory, never from a hub."""

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from minikv.model.devices import pick_device
from minikv.model.llama import Llama, ModelConfig

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = REPO_ROOT / "data" / "tiny-llama"


class CheckpointError(ValueError):
    """A model directory minikv cannot load; the message names the problem in one line."""


# minikv's ModelConfig field -> transformers' LlamaConfig field: the one map both directions read.
# (rope_theta is the exception: transformers keeps it inside `rope_parameters`.)
HF_FIELDS: dict[str, str] = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads", "head_dim": "head_dim",
    "num_kv_heads": "num_key_value_heads", "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps", "tie_word_embeddings": "tie_word_embeddings",
}
OPTIONAL_HF_FIELDS = {"num_key_value_heads", "head_dim"}  # None: derived from the head count


def default_model_dir() -> Path:
    """$MINIKV_MODEL if set, else the tiny model shipped in data/."""
    return Path(os.environ.get("MINIKV_MODEL", DEFAULT_MODEL_DIR))


def describe_model_dir(path: str | Path | None) -> str:
    """Where a model comes from, for a startup log: the path, and why that one."""
    if path is not None:
        return str(path)
    env = os.environ.get("MINIKV_MODEL")
    return f"{env} (from MINIKV_MODEL)" if env is not None else "data/tiny-llama (shipped)"


def load_or_refuse(what: str, load: Callable[[], T]) -> T:
    """`load()`, or CheckpointError "`what`: the first line of the library's message" (never a traceback)."""
    try:
        return load()
    except Exception as e:  # malformed JSON, unknown fields, unreadable files: report, don't crash
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        first = lines[0] if lines else type(e).__name__
        raise CheckpointError(f"{what}: {first if len(first) <= 300 else first[:297] + '...'}") from None


def model_config_from_hf(hf_config: LlamaConfig) -> ModelConfig:
    """Read a transformers LlamaConfig through HF_FIELDS; refuse what minikv's Llama does not implement."""
    rope = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} is not supported (only 'default')")
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise ValueError("attention or MLP biases are not supported")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only 'silu')")
    values = {ours: getattr(hf_config, theirs, None) for ours, theirs in HF_FIELDS.items()}
    for ours, theirs in HF_FIELDS.items():  # sizes: whole numbers >= 1 (0 layers would answer newlines)
        value = values[ours]
        if ours in ("rms_norm_eps", "tie_word_embeddings") or value is None and theirs in OPTIONAL_HF_FIELDS:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config.json: {theirs} must be a positive integer, got {value!r}")
    values["num_kv_heads"] = values["num_kv_heads"] or values["num_heads"]
    values["head_dim"] = values["head_dim"] or values["hidden_size"] // values["num_heads"]
    values["tie_word_embeddings"] = bool(values["tie_word_embeddings"])
    values["rope_theta"] = float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
    return ModelConfig(**values)


def hf_config_for(config: ModelConfig, tok: PreTrainedTokenizerBase) -> LlamaConfig:
    """The transformers config that describes `config`, through the same HF_FIELDS."""
    return LlamaConfig(**{theirs: getattr(config, ours) for ours, theirs in HF_FIELDS.items()},
                       rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
                       bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def load_hf_config(path: Path) -> LlamaConfig:
    """Read and check config.json of a local Llama checkpoint."""
    if path.is_file():
        raise CheckpointError(f"{path} is a file; give the checkpoint's directory (the one with config.json)")
    if not path.is_dir():
        raise CheckpointError(f"model directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path} has no config.json: not a Hugging Face checkpoint")
    config = load_or_refuse(f"cannot read {path / 'config.json'}",
                            lambda: AutoConfig.from_pretrained(path, local_files_only=True))
    if (kind := config.model_type) != "llama":
        raise CheckpointError(f"{path} holds a {kind!r} model; minikv runs Llama-family models only")
    return config


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: Path, hf_config: LlamaConfig) -> PreTrainedTokenizerBase:
    """The checkpoint's own tokenizer, checked to fit the embedding table, or CheckpointError in one line."""
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{path} has no tokenizer: none of {', '.join(TOKENIZER_FILES)}")
    tokenizer = load_or_refuse(f"cannot load a tokenizer from {path} (tokenizer.json, tokenizer_config.json)",
                               lambda: AutoTokenizer.from_pretrained(path, local_files_only=True))
    vocab = hf_config.vocab_size
    if len(tokenizer) > vocab:
        raise CheckpointError(f"{path}: the tokenizer has {len(tokenizer)} tokens but config.json says "
                              f"vocab_size={vocab}: ids from {vocab} up would have no embedding")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        ids = getattr(hf_config, name, None)
        for token_id in ids if isinstance(ids, list) else [ids]:
            if token_id is not None and not 0 <= token_id < vocab:
                raise CheckpointError(f"{path}: config.json: {name} {token_id} is outside the vocabulary "
                                      f"(vocab_size={vocab})")
    return tokenizer


def and_more(keys: list) -> str:
    """" (and N more)" after the first of `keys` is named, or nothing."""
    return f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' warnings and multi-line load report: load_model says what matters in one line."""
    hf_logging.disable_progress_bar()  # a startup log, not a progress bar
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def load_hf_weights(path: Path, hf_config: LlamaConfig, dtype: torch.dtype) -> LlamaForCausalLM:
    """transformers' LlamaForCausalLM from `path`, refused in one line unless it matches config.json."""
    hf, info = load_or_refuse(f"cannot load weights from {path}", lambda: LlamaForCausalLM.from_pretrained(
        path, dtype=dtype, local_files_only=True, output_loading_info=True, ignore_mismatched_sizes=True))
    missing, unexpected, mismatched = info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]
    unexpected = [k for k in unexpected if not k.endswith("rotary_emb.inv_freq")]  # old checkpoints: derived
    layers = {int(m.group(1)) for k in (set(hf.state_dict()) - set(missing)) | set(unexpected)
              if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    held = max(layers) + 1 if layers else 0
    if held != (said := hf_config.num_hidden_layers):
        problem = f"config.json says num_hidden_layers={said} but the weights hold {held} layers"
    elif mismatched:
        key, in_file, from_config = sorted(mismatched)[0]
        problem = (f"{key} is {tuple(in_file)} in the weights but config.json implies {tuple(from_config)}"
                   f"{and_more(mismatched)}: config.json does not describe these weights")
    elif missing:
        problem = f"the weights lack {sorted(missing)[0]}{and_more(missing)}, which config.json describes"
    elif unexpected:
        problem = (f"the weights hold {sorted(unexpected)[0]}{and_more(unexpected)}, which config.json does "
                   f"not describe")
    else:
        return hf
    raise CheckpointError(f"{path}: {problem}")


def load_tokenizer_of(path: str | Path | None = None) -> PreTrainedTokenizerBase:
    """A checkpoint's tokenizer alone, checked as `load_model` checks it (a server's HTTP side)."""
    path = Path(path) if path is not None else default_model_dir()
    with quiet_transformers():
        return load_tokenizer(path, load_hf_config(path))


def load_model(path: str | Path | None = None, device: str | torch.device | None = None,
               dtype: torch.dtype = torch.float32) -> tuple[Llama, PreTrainedTokenizerBase]:
    """Build minikv's Llama from a local checkpoint directory and return it with its tokenizer."""
    target = pick_device(device)  # a device this machine lacks fails before anything loads
    path = Path(path) if path is not None else default_model_dir()
    with quiet_transformers():
        hf_config = load_hf_config(path)
        try:
            config = model_config_from_hf(hf_config)
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None
        tokenizer = load_tokenizer(path, hf_config)
        hf_model = load_hf_weights(path, hf_config, dtype)
    model = Llama(config).to(dtype)
    model.load_state_dict(from_hf_state_dict(hf_model.state_dict(), config))
    return model.to(target).eval(), tokenizer


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
            out[f"layers.{layer}.{packed}.weight"] = torch.cat([out.pop(n) for n in names])  # (rows, in)
    if config.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def to_hf_state_dict(model: Llama) -> dict[str, torch.Tensor]:
    """minikv's weights under transformers' names, the packed projections split back."""
    c = model.config
    kv_rows = c.num_kv_heads * c.head_dim
    rows = {"self_attn.qkv_proj": [c.num_heads * c.head_dim, kv_rows, kv_rows],
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


def to_hf_model(model: Llama, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A transformers LlamaForCausalLM holding exactly minikv's weights."""
    hf_model = LlamaForCausalLM(hf_config_for(model.config, tokenizer))
    missing, unexpected = hf_model.load_state_dict(to_hf_state_dict(model), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return hf_model.to(model.dtype).eval()


def save_checkpoint(model: Llama, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Write `model` and `tokenizer` with save_pretrained, loadable by AutoModelForCausalLM."""
    to_hf_model(model.cpu(), tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)
