"""minikv's Llama forward equals transformers' LlamaForCausalLM."""

from __future__ import annotations


import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from minikv.attention.dense import DenseAttention, causal_mask
from minikv.model.checkpoint import from_hf_state_dict, model_config_from_hf
from minikv.model.contiguous_cache import ContiguousCache
from minikv.model.llama import Llama, ModelConfig

RANDOM_CONFIGS = [
    dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),  # GQA
    dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=1, tie_word_embeddings=False),  # MQA
    dict(hidden_size=80, num_attention_heads=5, num_key_value_heads=5, tie_word_embeddings=True),  # odd head count
    dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=12, tie_word_embeddings=False),
]


def random_pair(seed: int, **overrides) -> tuple[Llama, LlamaForCausalLM]:
    torch.manual_seed(seed)
    hf_cfg = LlamaConfig(vocab_size=53, intermediate_size=128, num_hidden_layers=2,
                         max_position_embeddings=256, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0}, **overrides)
    hf = LlamaForCausalLM(hf_cfg).eval()
    for p in hf.parameters():  # make norms non-trivial too
        p.data.normal_(0, 0.2)
    cfg = model_config_from_hf(hf_cfg)
    ours = Llama(cfg).eval()
    ours.load_state_dict(from_hf_state_dict(hf.state_dict(), cfg))
    return ours, hf


def dense_logits(model: Llama, ids: torch.Tensor) -> torch.Tensor:
    B, T = ids.shape
    pos = torch.arange(T).expand(B, T)
    return model(ids, pos, DenseAttention(causal_mask(B, T)))


@pytest.mark.parametrize("overrides", RANDOM_CONFIGS)
def test_logits_match_transformers_on_random_configs(overrides):
    """Dense forward logits equal LlamaForCausalLM's within 1e-4 (fp32)."""
    ours, hf = random_pair(0, **overrides)
    ids = torch.randint(0, 53, (2, 37))
    with torch.no_grad():
        diff = (dense_logits(ours, ids) - hf(ids).logits).abs().max().item()
    assert diff <= 1e-4, diff


def test_logits_match_transformers_on_shipped_model(tiny):
    """The shipped checkpoint gives the same logits through minikv and transformers."""
    model, tok = tiny
    hf = LlamaForCausalLM.from_pretrained(model_dir(), dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode("alice: save card 4111 2222 3333 4444.\nsaved card 4111")])
    with torch.no_grad():
        diff = (dense_logits(model, ids) - hf(ids).logits).abs().max().item()
    assert diff <= 1e-4, diff


def model_dir():
    from minikv.model.checkpoint import default_model_dir

    return default_model_dir()


@pytest.mark.parametrize("overrides", RANDOM_CONFIGS[:3])
def test_contiguous_cache_prefill_then_decode_equals_dense(overrides):
    """Prefilling then decoding one token at a time through the cache reproduces dense logits."""
    ours, _ = random_pair(1, **overrides)
    ids = torch.randint(0, 53, (1, 20))
    with torch.no_grad():
        full = dense_logits(ours, ids)[0]
        cache = ContiguousCache(ours.config, 1, 32)
        step = cache.step([0], 12)
        got = [ours(ids[:, :12], cache.positions([0], 12), step)[0]]
        step.commit()
        for t in range(12, 20):
            step = cache.step([0], 1)
            got.append(ours(ids[:, t : t + 1], cache.positions([0], 1), step)[0])
            step.commit()
    assert (torch.cat(got) - full).abs().max().item() < 1e-5


def test_config_rejects_uneven_gqa():
    """A head count that does not divide into KV groups fails at construction with the numbers."""
    with pytest.raises(ValueError, match="num_heads \\(6\\).*num_kv_heads \\(4\\)"):
        ModelConfig(vocab_size=10, hidden_size=48, intermediate_size=64, num_layers=1, num_heads=6,
                    num_kv_heads=4, head_dim=8, max_position_embeddings=64)


def test_unsupported_rope_scaling_is_refused():
    """A rope type this model does not implement is refused, not silently ignored."""
    cfg = LlamaConfig(vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="rope_type 'linear'"):
        model_config_from_hf(cfg)


def test_packed_weights_round_trip_to_transformers_names():
    """qkv_proj and gate_up_proj split back into transformers' q/k/v and gate/up weights exactly."""
    from minikv.model.checkpoint import to_hf_state_dict

    ours, hf = random_pair(2, **RANDOM_CONFIGS[4])  # GQA with head_dim != hidden / heads
    back = to_hf_state_dict(ours)
    want = hf.state_dict()
    assert set(back) == set(want)
    assert all(torch.equal(back[name], want[name]) for name in want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_the_operation_by_operation_reference(dtype):
    """RMSNorm (F.rms_norm in float32, then the weight) gives exactly the bits of transformers' formula."""
    from minikv.model.llama import RMSNorm, rms_norm_reference

    torch.manual_seed(3)
    norm = RMSNorm(48, 1e-6).to(dtype)
    norm.weight.data.normal_()
    x = (torch.randn(64, 48) * 5).to(dtype)
    assert torch.equal(norm(x), rms_norm_reference(norm, x))


@pytest.mark.parametrize("num_seqs", [3, 20], ids=["per-request", "tiles"])
def test_last_layer_on_kept_rows_only_gives_the_full_forward_logits(num_seqs):
    """Llama.forward with last_layer_on_logits_only (the last layer on each request's last row) equals the full last layer."""
    from minikv.engine.page_pool import PagePool
    from minikv.engine.paged_step import PagedStep, SeqSlice

    ours, _ = random_pair(3, **RANDOM_CONFIGS[1])
    gen = torch.Generator().manual_seed(3)
    lens = torch.randint(2, 40, (num_seqs,), generator=gen).tolist()
    starts = [0 if i % 3 else n // 2 for i, n in enumerate(lens)]  # some prompts after a cached prefix
    pools = [PagePool(ours.config, sum(-(-n // 4) for n in lens), 4) for _ in range(2)]
    logits = []
    for pool in pools:
        slices = [SeqSlice(i + 1, pool.allocate(-(-n // 4), f"r{i}"), s, n - s) for i, (n, s) in enumerate(zip(lens, starts))]
        step = PagedStep(pool, slices)
        ids = torch.randint(0, 53, (len(step.positions),), generator=torch.Generator().manual_seed(4))
        pruned = pool is pools[0]
        calls, attend = [], step.attend
        step.attend = lambda *args, last_only=False: calls.append((args[0], last_only)) or attend(*args, last_only=last_only)
        with torch.inference_mode():
            logits.append(ours(ids, step.positions, step, logits_index=step.last_rows,
                               last_layer_on_logits_only=pruned))  # (B, V)
        assert [layer for layer, last in calls if last] == ([ours.config.num_layers - 1] if pruned else [])
    assert logits[0].shape == (num_seqs, 53)
    assert torch.allclose(logits[0], logits[1], atol=1e-5), (logits[0] - logits[1]).abs().max()
    assert torch.equal(pools[0].kv, pools[1].kv)


@pytest.mark.parametrize("rows", [1, 32, 300], ids=["one", "decode-batch", "prefill"])
def test_rotary_rotate_has_the_bits_of_the_reference(rows):
    """Rotary.rotate (in-place halves) equals transformers' x*cos + rotate_half(x)*sin bit for bit."""
    from minikv.model.llama import Rotary, rope_reference

    rotary = Rotary(48, 10000.0)
    positions = torch.arange(rows)
    x = torch.randn(rows, 12, 48)[:, :8]  # a strided slice, as qkv's query and key heads are
    cos_sin = rotary.cos_sin(positions, torch.float32)
    assert torch.equal(Rotary.rotate(x, cos_sin), rope_reference(x, cos_sin))
