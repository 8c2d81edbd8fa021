"""One attention call for a whole batch of requests of different lengths, read straight from pages, as
FlashAttention's varlen API and vLLM's paged kernels do, in plain tensor operations: query blocks meet
the key blocks (*tiles*) they may see, and a split softmax (split-K) joins them. See docs/engine.md.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class TilePlan:
    """One step's tiles, shared by every layer: n_blocks query blocks, n_tiles (block, key block) pairs."""

    block_rows: Tensor  # (n_blocks, block_q) row of q each block row reads; N (a zero row) pads
    tile_block: Tensor  # (n_tiles,) query block of each tile
    kv_rows: Tensor  # (n_tiles * KVH * block_k,) rows of the pool viewed as (slots * KVH, D) each tile reads
    tile_hidden: Tensor  # (n_tiles, block_q, block_k) True where the query may NOT see the key
    out_rows: Tensor  # (N,) where each query's output sits among the flattened (n_blocks * block_q) rows
    block_q: int  # query rows per block
    block_k: int  # keys per tile


def tile_plan(block_tables: Tensor, starts: Tensor, num_new: Tensor, page_size: int, num_kv_heads: int,
              block_q: int, pages_per_tile: int) -> TilePlan:
    """Which (query block, key block) tiles a step computes, and the causal mask inside each.

    Args:
        block_tables: (B, max_pages) each request's pages in order (padding is never seen).
        starts: (B,) tokens each request had cached before this step.
        num_new: (B,) queries each request adds this step (at least 1).
        block_q: query rows per block (1 when every request decodes one token).
        pages_per_tile: pages in a tile's key block.
    """
    device = block_tables.device
    assert bool((num_new >= 1).all()), "every request adds at least one token"
    N, block_k = int(num_new.sum()), pages_per_tile * page_size
    # a tile past a request's last page reads its first page again (masked): no other request's data
    block_tables = torch.cat([block_tables, block_tables[:, :1].expand(-1, pages_per_tile)], dim=1)
    cu_q = torch.cumsum(num_new, 0) - num_new  # (B,) first row of each request in q
    blocks_per_seq = (num_new + block_q - 1) // block_q  # (B,)
    block_seq, block_idx = segments(blocks_per_seq)  # (n_blocks,) each block's request and rank in it
    first = block_idx * block_q  # (n_blocks,) the block's first query, counted within its request
    rows_in = first[:, None] + torch.arange(block_q, device=device)  # (n_blocks, block_q)
    row_valid = rows_in < num_new[block_seq][:, None]  # (n_blocks, block_q)
    block_rows = torch.where(row_valid, cu_q[block_seq][:, None] + rows_in, N)  # N: the zero row
    q_pos = starts[block_seq][:, None] + rows_in  # (n_blocks, block_q) each query's position
    last_pos = starts[block_seq] + torch.minimum(first + block_q, num_new[block_seq]) - 1  # (n_blocks,)
    tile_block, tile_idx = segments(last_pos // block_k + 1)  # key blocks 0.. of the request each block sees
    page_idx = tile_idx[:, None] * pages_per_tile + torch.arange(pages_per_tile, device=device)  # (t, ppt)
    pages = block_tables[block_seq[tile_block][:, None], page_idx]  # (n_tiles, ppt)
    slots = (pages[:, :, None] * page_size + torch.arange(page_size, device=device)).view(-1, 1, block_k)
    kv_rows = (slots * num_kv_heads + torch.arange(num_kv_heads, device=device)[:, None]).flatten()  # t,h,s
    key_pos = tile_idx[:, None] * block_k + torch.arange(block_k, device=device)  # (n_tiles, block_k)
    tile_hidden = (key_pos[:, None, :] > q_pos[tile_block][:, :, None]) | ~row_valid[tile_block][:, :, None]
    out_rows = row_valid.flatten().nonzero().squeeze(1)  # (N,) in request order, padding skipped
    return TilePlan(block_rows, tile_block, kv_rows, tile_hidden, out_rows, block_q, block_k)


def segments(counts: Tensor) -> tuple[Tensor, Tensor]:
    """For counts (B,), the owner (0..B-1) and the rank within its owner of each of sum(counts) items."""
    total, dev = int(counts.sum()), counts.device
    owner = torch.repeat_interleave(torch.arange(len(counts), device=dev), counts, output_size=total)
    rank = torch.arange(total, device=dev) - (torch.cumsum(counts, 0) - counts)[owner]
    return owner, rank


def tiled_attention(q: Tensor, kv_pages: Tensor, plan: TilePlan) -> Tensor:
    """Causal attention of every request's queries q (N, H, D) over its own pages, in one call: kv_pages
    (2, num_pages, page_size, KVH, D) is one layer of the pool. Returns (N, H, D), as SDPA would."""
    N, H, D = q.shape
    KVH = kv_pages.shape[3]
    G, Bq, Bk = H // KVH, plan.block_q, plan.block_k
    n_blocks, n_tiles, R = plan.block_rows.shape[0], plan.tile_block.shape[0], plan.block_q * (H // KVH)
    q = q * (1.0 / math.sqrt(D))  # the softmax scale, applied to the fewest numbers
    # one query per block (decode): no padding rows; else row N (zeros) pads the blocks
    q_blocks = q if Bq == 1 else torch.cat([q, q.new_zeros(1, H, D)])[plan.block_rows]
    q_blocks = q_blocks.view(n_blocks, Bq, KVH, G, D).permute(0, 2, 1, 3, 4).reshape(n_blocks, KVH, R, D)
    keys = kv_pages[0].reshape(-1, D).index_select(0, plan.kv_rows).view(n_tiles, KVH, Bk, D)  # one gather
    tile_q = q_blocks if n_tiles == n_blocks else q_blocks[plan.tile_block]  # (n_tiles, KVH, R, D)
    scores = tile_q @ keys.transpose(-1, -2)  # (n_tiles, KVH, R, Bk)
    scores.view(n_tiles, KVH, Bq, G, Bk).masked_fill_(plan.tile_hidden[:, None, :, None, :], float("-inf"))
    tile_max = scores.amax(-1)  # (n_tiles, KVH, R); -inf where a row sees nothing in this tile
    row_max = torch.full((n_blocks, KVH, R), float("-inf"), dtype=q.dtype, device=q.device)
    row_max = row_max.scatter_reduce(0, plan.tile_block[:, None, None].expand_as(tile_max), tile_max, "amax")
    row_max = torch.where(torch.isinf(row_max), 0.0, row_max)  # padded rows see nothing at all
    probs = scores.sub_(row_max[plan.tile_block][..., None]).exp_()  # (n_tiles, KVH, R, Bk); hidden -> 0
    denom = q.new_zeros(n_blocks, KVH, R).index_add_(0, plan.tile_block, probs.sum(-1))
    values = weighted_values(probs, kv_pages[1], plan)  # (n_tiles, KVH, R, D)
    out = q.new_zeros(n_blocks, KVH, R, D).index_add_(0, plan.tile_block, values)
    out = out / denom.clamp_min(torch.finfo(q.dtype).tiny)[..., None]  # padded rows: 0 / tiny = 0
    out = out.view(n_blocks, KVH, Bq, G, D).permute(0, 2, 1, 3, 4).reshape(n_blocks * Bq, H, D)
    return out if Bq == 1 else out[plan.out_rows]  # (N, H, D)


def weighted_values(probs: Tensor, v_pages: Tensor, plan: TilePlan) -> Tensor:
    """Each tile's probabilities (n_tiles, KVH, R, Bk) times its values -> (n_tiles, KVH, R, D): gathered and
    multiplied in prefill; in decode `embedding_bag` sums the weighted rows from the pool, with no copy."""
    n_tiles, KVH, R, Bk = probs.shape
    D = v_pages.shape[-1]
    if plan.block_q > 1:
        values = v_pages.reshape(-1, D).index_select(0, plan.kv_rows).view(n_tiles, KVH, Bk, D)
        return probs @ values  # (n_tiles, KVH, R, D)
    bags = plan.kv_rows.view(n_tiles, KVH, 1, Bk).expand(-1, -1, R, -1).reshape(-1, Bk)  # (n_tiles KVH R, Bk)
    out = F.embedding_bag(bags, v_pages.reshape(-1, D), mode="sum", per_sample_weights=probs.reshape(-1, Bk))
    return out.view(n_tiles, KVH, R, D)
