"""The engine API's front door under bad input: each bad value is its own clear 400 or one-line error.

Bad inputs tried here (engine API surface): prompt text holding "</s>", "<pad>", "<unk>"; a prompt
that is an int, bytes, a list, None or empty; a lone surrogate; an undecodable byte; a character
outside the vocabulary; a tokenizer that ignores split_special_tokens; a pool larger than memory;
devices this machine lacks ("meta", "foo", "cuda:N" past the last GPU) for load_model and Cluster.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from minikv.model.checkpoint import DEFAULT_MODEL_DIR, load_model
from minikv.engine.config import EngineConfig
from minikv.model.devices import DeviceError, pick_device
from minikv.disagg.cluster import Cluster, ClusterConfig
from minikv.engine.engine import Engine
from minikv.engine.page_pool import PoolTooLarge
from minikv.engine.request import Request
from minikv.model.tokenizer import PromptError, encode_prompt

CONTROL_TEXT = ["ab</s>cd\n", "<pad>\n", "<unk>\n", "</s><pad><unk>\n"]


@pytest.fixture(scope="module")
def shipped_tokenizer():
    """The shipped tokenizer as transformers loads it, minikv not involved."""
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)


@pytest.mark.parametrize("text", CONTROL_TEXT)
def test_special_token_text_is_plain_characters(shipped_tokenizer, text):
    """"</s>", "<pad>", "<unk>" in a prompt encode as their characters, one id each, never a control token."""
    ids = encode_prompt(shipped_tokenizer, text)
    assert ids == [shipped_tokenizer.convert_tokens_to_ids(ch) for ch in text]
    assert not set(ids) & set(shipped_tokenizer.all_special_ids)


def test_end_of_sequence_text_does_not_end_the_prompt(tiny):
    """A prompt with "</s>" in it is served whole: every character counts as a prompt token."""
    model, tok = tiny
    response = Engine(model, tok, EngineConfig()).generate(["ab</s>cd\n"], max_tokens=4)[0]
    assert response.status == 200 and response.usage.prompt_tokens == len("ab</s>cd\n")


def test_cluster_reads_control_text_as_characters(tiny):
    """The disaggregated front door encodes "<pad>" as characters too (the same admission)."""
    model, tok = tiny
    response = Cluster(model, tok, ClusterConfig(prefill_pages=64)).generate(["x<pad></s>\n"], max_tokens=4)[0]
    assert response.status == 200 and response.usage.prompt_tokens == len("x<pad></s>\n")


@pytest.mark.parametrize("prompt, reason", [
    (123, "prompt must be a string, got int"),
    (b"ab\n", "prompt must be a string, got bytes"),
    (["a"], "prompt must be a string, got list"),
    (None, "prompt must be a string, got NoneType"),
    ("", "empty prompt"),
    ("a\ud800b\n", "character 1 is a lone surrogate (U+D800)"),
    ("ab\udcffcd\n", "not valid UTF-8: byte 0xFF at character 2"),
    ("h\u00e9llo\n", "1 character(s) outside the model's vocabulary: '\u00e9'"),
])
def test_bad_prompt_is_its_own_400_and_the_engine_serves_on(tiny, prompt, reason):
    """Each bad prompt is answered 400 with its own reason; the next request is still served."""
    model, tok = tiny
    engine = Engine(model, tok, EngineConfig())
    bad, good = engine.generate([prompt, "alice: save pin 1.\n"], max_tokens=4)
    assert bad.status == 400 and reason in bad.error
    assert good.status == 200


def test_tokenizer_that_ignores_split_special_tokens_is_refused(shipped_tokenizer):
    """If a tokenizer still turns text into a control token, the prompt is refused, not obeyed."""

    class Obeys:  # a tokenizer that matches special-token strings whatever it is told
        def __getattr__(self, name):
            return getattr(shipped_tokenizer, name)

        def __call__(self, text, **kwargs):
            return shipped_tokenizer(text, add_special_tokens=False, split_special_tokens=False)

    with pytest.raises(PromptError, match=r"control token\(s\) \['</s>'\]"):
        encode_prompt(Obeys(), "ab</s>cd\n")


def test_pool_larger_than_memory_is_one_line_with_both_numbers(tiny):
    """A pool that cannot fit says how many bytes it needs and how many there are, before allocating."""
    model, tok = tiny
    with pytest.raises(PoolTooLarge, match=r"needs 98,304,000,000,000 bytes; cpu has [\d,]+ bytes available") as e:
        Engine(model, tok, EngineConfig(num_pages=1_000_000_000))
    assert "\n" not in str(e.value)


def missing_cuda_device() -> str:
    """A CUDA device name this machine does not have."""
    return f"cuda:{torch.cuda.device_count()}"


@pytest.mark.parametrize("name, reason", [
    ("meta", "holds tensor shapes but no data"),
    ("foo", "unknown device 'foo'"),
    ("", "unknown device ''"),
    ("cuda:x", "unknown device 'cuda:x'"),
])
def test_unusable_device_is_refused_by_name(name, reason):
    """pick_device refuses a device that cannot run a model, naming it."""
    with pytest.raises(DeviceError, match=reason):
        pick_device(name)


def test_missing_cuda_device_is_refused():
    """A CUDA index past the last GPU (or any CUDA on a CPU-only torch) is refused by name."""
    name = missing_cuda_device()
    with pytest.raises(DeviceError, match=f"device '{name}'"):
        pick_device(name)


def test_load_model_refuses_a_missing_device_before_loading():
    """load_model checks the device first: a device the machine lacks is a DeviceError, not a traceback."""
    with pytest.raises(DeviceError, match="meta"):
        load_model(device="meta")


def test_cluster_refuses_a_device_it_cannot_use(tiny):
    """ClusterConfig.devices goes through the same device check."""
    model, tok = tiny
    with pytest.raises(DeviceError, match="unknown device 'gpu0'"):
        Cluster(model, tok, ClusterConfig(prefill_pages=64, devices=("cpu", "gpu0")))


def test_admission_rejects_before_pages_for_every_bad_prompt(tiny):
    """A bad prompt holds no page: the pool is whole after all of them are refused."""
    model, tok = tiny
    engine = Engine(model, tok, EngineConfig())
    for prompt in [123, b"x", "a\ud800", "\u00e9"]:
        engine.submit(Request(prompt))
    engine.run()
    assert engine.pool.num_free_pages == engine.pool.num_pages
