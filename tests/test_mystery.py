"""`serve --mystery SEED`: the switches come from SEED alone, and nothing the server sends or writes names them."""

from __future__ import annotations

import argparse
import functools
import json
import random
import subprocess
import sys

import httpx
import pytest

from minikv.attacks.workload import long_document_prompt
from minikv.disagg.switches import SafetySwitches
from minikv.serve.flags import add_serve_arguments, check_args
from minikv.serve.launch import ServerProcess, ServerThread
from minikv.serve.mystery import INCIDENT_PREFILL_PAGES, draw, prefill_pages

KEYS = {"alice": "sk-alice-0001", "bob": "sk-bob-0002"}
KEY_ARGS = [a for tenant, key in KEYS.items() for a in ("--api-key", f"{tenant}={key}")]
# what would give a switch away: its name (as code or words), the words of its refusals, the pools, the presets
TELLS = [*SafetySwitches.names(), *(n.replace("_", " ") for n in SafetySwitches.names()), "checksum", "canary",
         "quota", "partition", "scrub", "salt", "switch", "preset", "pool", "pages", "vulnerable", "tenant's"]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_same_seed_draws_the_same_switches_in_every_process():
    """draw(seed) in this process equals draw(seed) in a fresh interpreter (another string-hash seed)."""
    code = ("import json; from minikv.serve.mystery import draw; "
            "print(json.dumps([draw(s).as_dict() for s in range(8)]))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": "", "PYTHONPATH": ":".join(sys.path)})
    assert json.loads(other.stdout) == [draw(s).as_dict() for s in range(8)]
    assert draw(3) == draw(3) and draw(3) != draw(4)


def test_seeds_cover_every_switch_on_and_off():
    """Over seeds 0-31 every switch is drawn on and off, and the draws differ."""
    draws = [draw(s) for s in range(32)]
    for name in SafetySwitches.names():
        assert {getattr(d, name) for d in draws} == {True, False}, name
    assert len({tuple(d.as_dict().values()) for d in draws}) > 24


def test_the_seed_alone_decides_the_switches():
    """With --mystery, the flags that would choose switches or the server are refused; two keys are needed."""
    keys, switches = check_args(parse("--mystery", "7", *KEY_ARGS))
    assert switches == draw(7) and set(keys.values()) == {"alice", "bob"}
    for flags in (["--preset", "safe"], ["--enable", "cache_salt"], ["--disable", "kv_canary"], ["--disagg"],
                  ["--context-len", "672"], ["--prefill-chunk", "64"]):
        with pytest.raises(ValueError, match=f"{flags[0]} cannot be given with --mystery"):
            check_args(parse("--mystery", "7", *KEY_ARGS, *flags))
    with pytest.raises(ValueError, match="needs 2 tenants"):
        check_args(parse("--mystery", "7", "--api-key", "alice=sk-a"))


def test_the_server_runs_the_drawn_switches_and_pool(tiny):
    """The pair behind a mystery server holds exactly draw(seed), over the pool its startup_check asks for."""
    model, tok = tiny
    for seed in (3, 5):  # startup_check on, then off
        with ServerThread(["--mystery", str(seed), *KEY_ARGS], model, tok) as server:
            door = server.server.engine_loop.door
            assert door.switches == draw(seed) and door.config.context_len == 1024
            assert door.config.prefill_pages >= prefill_pages(draw(seed))
    assert draw(3).startup_check and not draw(5).startup_check and prefill_pages(draw(5)) == INCIDENT_PREFILL_PAGES


def read_everything(server, log) -> tuple[list[int], str]:
    """Every route, header and body a client can get (served, refused by the door and by the engine), then every
    line the server printed and logged."""
    def call(method: str, path: str, key: str | None = KEYS["alice"], **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.request(method, server.url + path, headers=headers, timeout=60, **kw)

    get, post = (functools.partial(call, method) for method in ("GET", "POST"))
    document = long_document_prompt("bob", 800, random.Random(0))  # past the incident's pool: the engine refuses
    short = long_document_prompt("bob", 300, random.Random(1))
    replies = [get("/v1/models"), get("/v1/models/tiny-llama"), get("/v1/models/other"), get("/health", None),
               get("/health", server.admin_key), get("/nowhere"), get("/v1/models", "sk-wrong"),
               get("/v1/models", None),
               post("/v1/completions", json={"model": "tiny-llama", "prompt": "alice: save pin 4821.\n"}),
               post("/v1/completions", json={"model": "tiny-llama", "prompt": "alice: save pin 1.\n", "stream": True}),
               post("/v1/chat/completions", json={"model": "tiny-llama",
                                                  "messages": [{"role": "user", "content": "hi"}]}),
               post("/v1/completions", content=b"{not json"), post("/v1/completions", json={"prompt": 5}),
               post("/v1/completions", json={"model": "tiny-llama", "prompt": "x" * 1100}),
               post("/v1/completions", json={"model": "other", "prompt": "hi"}), post("/v1/models", json={}),
               post("/v1/completions", json={"model": "tiny-llama", "prompt": short}),
               post("/v1/completions", json={"model": "tiny-llama", "prompt": document}, key=KEYS["bob"]),
               post("/v1/completions", json={"model": "tiny-llama", "prompt": document, "stream": True},
                    key=KEYS["bob"])]
    assert {r.status_code for r in replies} >= {200, 400, 401, 404}
    seen = [f"{r.status_code} {json.dumps(dict(r.headers))} {r.text}" for r in replies]
    return [r.status_code for r in replies], "\n".join([*seen, server.output(), log.read_text()])


def tells_in(text: str) -> list[str]:
    return [t for t in TELLS if t.lower() in text.lower()]


@pytest.mark.parametrize("seed", [0, 6])  # an over-length prompt: a KV check's 500 (0), reject_check's 400 (6)
def test_a_mystery_server_names_no_switch_anywhere(tmp_path, seed):
    """Routes, headers, error bodies, its output and its gateway log: none names a switch, a pool or a preset."""
    log = tmp_path / "gateway.jsonl"
    with ServerProcess(["--mystery", str(seed), *KEY_ARGS, "--log", str(log)]) as server:
        statuses, seen = read_everything(server, log)
    assert statuses[-2:] == [{0: 500, 6: 400}[seed]] * 2 and f"mystery seed {seed}" in seen
    assert tells_in(seen) == []


def test_a_plain_server_says_what_a_mystery_one_hides(tmp_path):
    """The same reading of a --disagg server with the same switches finds them: the scan can fail."""
    log = tmp_path / "gateway.jsonl"
    switches = [a for n, on in draw(6).as_dict().items() for a in (("--enable" if on else "--disable"), n)]
    with ServerProcess(["--disagg", "--preset", "vulnerable", *switches, *KEY_ARGS, "--log", str(log)]) as server:
        _, seen = read_everything(server, log)
    assert {"reject_check", "cache_partition", "pool", "pages", "tenant's"} <= set(tells_in(seen))
