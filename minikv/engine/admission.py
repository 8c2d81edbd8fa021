"""Admission control: the checks a request must pass before it may hold any KV cache.

Every refusal is an HTTP 400 whose message names the numbers involved. The checks run
cheapest first, and the same functions serve the single-node engine and the disaggregated
front door, so both refuse the same requests with the same words.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from minikv.engine.request import Request
from minikv.model.sampling import SamplingParams
from minikv.model.tokenizer import PromptError, encode_prompt


class Rejected(Exception):
    """A request answered 400; `prompt_tokens` is how many tokens it had, when known."""

    def __init__(self, reason: str, prompt_tokens: int = 0) -> None:
        super().__init__(reason)
        self.reason, self.prompt_tokens = reason, prompt_tokens


def check_request(request: Request, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Shape checks that need no capacity numbers; returns the prompt's token ids.

    The tenant and request_id are checked before this, when the front door takes an id.
    """
    if isinstance(request.max_tokens, bool) or not isinstance(request.max_tokens, int) or request.max_tokens < 1:
        raise Rejected(f"max_tokens must be a positive integer, got {request.max_tokens!r}")
    if not isinstance(request.sampling, SamplingParams):
        raise Rejected(f"sampling must be SamplingParams, got {type(request.sampling).__name__}")
    problem = request.sampling.problem()
    if problem:
        raise Rejected(problem)
    check_cache_salt(request.cache_salt)
    try:
        return encode_prompt(tokenizer, request.prompt)
    except PromptError as e:
        raise Rejected(str(e)) from None


def check_at_door(request: Request, tokenizer: PreTrainedTokenizerBase, context_len: int) -> list[int]:
    """What every front door checks (Engine, Cluster, DistCluster): the request's shape, then the
    advertised window. Returns the prompt's token ids, or raises Rejected."""
    ids = check_request(request, tokenizer)
    check_context(len(ids), request.max_tokens, context_len)
    return ids


MAX_CACHE_SALT_CHARS = 256


def check_cache_salt(salt: object) -> None:
    """A cache_salt is client input like any other: a bad one is a 400, never a crash (vLLM's
    CVE-2026-105756 ended the engine core for every user on an over-long salt)."""
    if salt is None:
        return
    if not isinstance(salt, str) or not 1 <= len(salt) <= MAX_CACHE_SALT_CHARS or not salt.isprintable():
        shown = f"{len(salt)} characters" if isinstance(salt, str) else type(salt).__name__
        raise Rejected(f"cache_salt must be 1 to {MAX_CACHE_SALT_CHARS} printable characters, got {shown}")


def check_context(prompt_len: int, max_tokens: int, context_len: int) -> None:
    """The prompt, and the prompt plus its output, must fit the advertised context window."""
    if prompt_len > context_len - 1:
        raise Rejected(f"prompt has {prompt_len} tokens; the context window is {context_len} tokens (prompt + output)", prompt_len)
    if prompt_len + max_tokens > context_len:
        raise Rejected(f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = {prompt_len + max_tokens} "
                       f"exceeds the context window of {context_len} tokens", prompt_len)


def check_pool(num_tokens: int, pool_tokens: int, node: str, prompt_len: int) -> None:
    """A request that needs more KV than the whole pool can never run: refuse it now."""
    if num_tokens > pool_tokens:
        raise Rejected(f"request needs {num_tokens} tokens of KV cache; the {node} node's pool holds at most "
                       f"{pool_tokens} tokens", prompt_len)
