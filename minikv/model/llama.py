"""A Llama-family decoder whose attention reads and writes a cache the caller passes in.

RMSNorm, rotary positions (RoPE), grouped-query attention and a SwiGLU MLP, named as transformers'
`LlamaForCausalLM`, so a local checkpoint loads into it (checkpoint.py). Unlike the usual one-file GPT:
- positions are an input: in a paged engine a token's position belongs to its request, not its batch row;
- K and V go to an `AttentionBackend` (attention/dense.py): a contiguous cache, a page pool, or none;
- Q, K, V come out of one matmul (`qkv_proj`), the MLP's gate and up out of another, as vLLM packs them.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minikv.attention.dense import AttentionBackend


@dataclass(frozen=True)
class ModelConfig:
    """The numbers that shape a Llama (checkpoint.model_config_from_hf reads them off transformers')."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers, in float32."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * 4


class RMSNorm(nn.Module):
    """x / rms(x) * weight, the normalisation computed in float32 as Llama does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


def rms_norm_reference(norm: RMSNorm, x: Tensor) -> Tensor:
    """transformers' LlamaRMSNorm, operation by operation (tests check RMSNorm against it)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * x32.to(x.dtype)


class Rotary(nn.Module):
    """RoPE: rotate each query/key pair of dimensions by an angle proportional to position."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (D/2,)

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of every angle, (..., 1, D): computed once per forward, shared by every layer."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # (..., D/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (..., D)
        return emb.cos().to(dtype).unsqueeze(-2), emb.sin().to(dtype).unsqueeze(-2)  # broadcast over heads

    @staticmethod
    def rotate(x: Tensor, cos_sin: tuple[Tensor, Tensor]) -> Tensor:
        """x (..., heads, D) rotated by its positions' angles: halves (x1, x2) become (x1 cos - x2 sin,
        x2 cos + x1 sin), in place in x * cos: one new tensor where rope_reference makes four, same bits."""
        cos, sin = cos_sin
        half = x.shape[-1] // 2
        out = x * cos  # (..., heads, D)
        out[..., :half].sub_(x[..., half:] * sin[..., :half])  # x1 cos - x2 sin
        out[..., half:].add_(x[..., :half] * sin[..., half:])  # x2 cos + x1 sin
        return out


def rope_reference(x: Tensor, cos_sin: tuple[Tensor, Tensor]) -> Tensor:
    """transformers' apply_rotary_pos_emb for one tensor: x * cos + rotate_half(x) * sin (for tests)."""
    cos, sin = cos_sin
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Grouped-query self-attention; the cache lives in the backend, not here."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        H, KVH, h, d = config.num_heads, config.num_kv_heads, config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = H, KVH, d
        self.qkv_proj = nn.Linear(h, (H + 2 * KVH) * d, bias=False)  # q | k | v rows
        self.o_proj = nn.Linear(H * d, h, bias=False)

    def forward(self, x: Tensor, cos_sin: tuple[Tensor, Tensor], kv: AttentionBackend,
                rows: Tensor | None = None) -> Tensor:
        """Attention output of every token, or with `rows` (M,) of those only (every K and V is kept)."""
        lead = x.shape[:-1]  # (N,) for a flat batch of tokens, (B, T) for dense
        H, KVH = self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(*lead, H + 2 * KVH, self.head_dim)  # (..., H + 2 KVH, D)
        v = qkv[..., H + KVH :, :]  # (..., KVH, D)
        if rows is None:
            qk = Rotary.rotate(qkv[..., : H + KVH, :], cos_sin)  # queries and keys rotated together
            out = kv.attend(self.layer, qk[..., :H, :], qk[..., H:, :], v)  # (..., H, D); K cached after RoPE
        else:  # every token's key and value, only the kept rows' queries
            assert x.dim() == 2, "rows index a flat batch of tokens (N, hidden)"
            k = Rotary.rotate(qkv[:, H : H + KVH], cos_sin)  # (N, KVH, D)
            q = Rotary.rotate(qkv[rows, :H], (cos_sin[0][rows], cos_sin[1][rows]))  # (M, H, D)
            out = kv.attend(self.layer, q, k, v, last_only=True)  # (M, H, D)
        return self.o_proj(out.reshape(*out.shape[:-2], H * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up from one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Linear(h, 2 * i, bias=False)  # gate rows, then up rows
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (..., I) each
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cos_sin: tuple[Tensor, Tensor], kv: AttentionBackend,
                rows: Tensor | None = None) -> Tensor:
        attn = self.self_attn(self.input_layernorm(x), cos_sin, kv, rows)
        x = (x if rows is None else x[rows]) + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """The whole decoder. Parameter names follow transformers' LlamaForCausalLM minus 'model.'."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = Rotary(config.head_dim, config.rope_theta)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: Tensor, positions: Tensor, kv: AttentionBackend,
                logits_index: Tensor | None = None, last_layer_on_logits_only: bool = False) -> Tensor:
        """Logits (..., vocab_size) in float32 of the new tokens; the backend `kv` keeps their K/V.

        Args:
            input_ids: (N,) a flat batch of new tokens, or (B, T) for dense attention.
            positions: same shape: each token's position in its own request.
            logits_index: optional (M,) rows whose logits are needed (each request's last token).
            last_layer_on_logits_only: the last layer stores every token's K/V but computes the rest only
                for the `logits_index` rows (the backend must take `last_only`; test_model.py checks it).
        """
        if positions.shape != input_ids.shape:
            raise ValueError(f"positions {tuple(positions.shape)} != input_ids {tuple(input_ids.shape)}")
        assert logits_index is not None or not last_layer_on_logits_only, "which rows? give logits_index"
        x = self.embed_tokens(input_ids)  # (..., hidden)
        cos_sin = self.rotary.cos_sin(positions, x.dtype)  # (..., 1, D) each
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):  # the last one on the kept rows alone if asked: (M, hidden)
            x = layer(x, cos_sin, kv, logits_index if last_layer_on_logits_only and i == last else None)
        x = self.norm(x)
        if logits_index is not None and not last_layer_on_logits_only:
            x = x[logits_index]  # (M, hidden)
        return self.lm_head(x).float()

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def num_parameters(self) -> int:
        """Distinct parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
