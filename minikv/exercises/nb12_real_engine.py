"""Checkers for notebook 12 (a real engine): a repeat's cached tokens, against minikv's engine serving the
prompt twice at that block size (vLLM's rule too), and the properties a per-tenant `cache_salt` needs, on
generated keys."""

import random
import string
from collections.abc import Callable

from minikv.engine.config import EngineConfig
from minikv.engine.engine import Engine
from minikv.engine.front_door import MAX_SALT_CHARS
from minikv.exercises import expect, expect_cases, shipped_model


def cached_on_repeat(tokens: int, block: int) -> int:
    """The cached_tokens minikv's engine reports when a random `tokens`-token prompt comes a second time."""
    engine = Engine(*shipped_model(), EngineConfig(page_size=block, num_pages=4096 // block, event_log=False))
    rng = random.Random(tokens)
    prompt = "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(tokens - 1)) + "\n"
    engine.generate([prompt], max_tokens=1)
    return engine.generate([prompt], max_tokens=1)[0].usage.cached_tokens


def check_cached_on_repeat(fn: Callable[[int, int], int]) -> None:
    """fn(prompt_tokens, block_size) -> the cached_tokens an exact repeat of the prompt reports."""
    rng = random.Random(11)
    cases = [(512, 32), (513, 32), (32, 32), (33, 32), (31, 32), (100, 16), (1, 16)]
    cases += [(rng.randint(2, 600), rng.choice([8, 16, 32])) for _ in range(5)]
    expect_cases(fn, cached_on_repeat, cases, "a {}-token prompt, blocks of {}", "Only whole blocks are "
                 "cached, and the prompt's last token is always computed (it yields the logits).",
                 "correct on {} prompts: whole blocks, never the last token")


def check_salt_for(fn: Callable[[str, str], str]) -> None:
    """fn(api_key, gateway_secret) -> the cache_salt a gateway sends for that key's requests."""
    rng = random.Random(12)
    secret = "".join(rng.choices(string.ascii_letters, k=24))
    keys = ["sk-" + "".join(rng.choices(string.ascii_lowercase + string.digits, k=12)) for _ in range(40)]
    salts = [fn(key, secret) for key in keys]
    for key, salt in zip(keys, salts):
        expect(isinstance(salt, str) and 1 <= len(salt) <= MAX_SALT_CHARS and salt.isprintable(), True,
               f"salt {salt!r} for {key!r}", f"A cache_salt is 1 to {MAX_SALT_CHARS} printable characters.")
        expect(key[3:] in salt or secret in salt, False, f"salt {salt!r} for {key!r}",
               "The salt reaches the engine and its logs: it must not carry the key or the secret.")
        expect(fn(key, secret), salt, f"{key!r} twice",
               "The same tenant needs the same salt, or it loses its own hits.")
    expect(len(set(salts)), len(keys), f"{len(keys)} keys", "Two tenants with one salt share a cache again.")
    expect(fn(keys[0], secret + "x") != salts[0], True, "another gateway secret",
           "Anyone who knows a key can compute this salt: what do you hold that a tenant does not, "
           "and which function mixes it in so that nothing can be worked backwards?")
    print(f"correct on {len(keys)} keys: stable, distinct, and no key or secret in sight")
