"""`python -m minikv`: the JSON contract, and a clear one-line error for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def cli(*args: str, env_model: str | None = None) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ)
    if env_model:
        env["MINIKV_MODEL"] = env_model
    return subprocess.run([sys.executable, "-m", "minikv", *args], capture_output=True, text=True, timeout=300, env=env)


def test_generate_json_contract():
    """generate --json prints one response per prompt with exactly the promised fields."""
    out = cli("generate", "--prompt", "alice: save pin 0912.\\n", "--prompt", "bob: save memo hi.\\n", "--json", "--max-tokens", "24")
    assert out.returncode == 0, out.stderr
    responses = json.loads(out.stdout)
    assert len(responses) == 2
    for r in responses:
        assert set(r) == {"status", "text", "usage", "ttft_s", "error"}
        assert r["status"] == 200 and r["error"] is None and isinstance(r["ttft_s"], float)
        assert set(r["usage"]) == {"prompt_tokens", "completion_tokens"}
    assert responses[0]["text"] == "saved pin 0912."


@pytest.mark.parametrize("prompt, reason", [
    ("", "empty prompt"),
    ("x" * 1100, "context window is 1024"),
    ("héllo", "outside the model's vocabulary"),
])
def test_bad_prompt_is_a_400_in_json_and_exit_1(prompt, reason):
    """A bad prompt gets status 400 with its reason; the others are still served; exit 1."""
    out = cli("generate", "--prompt", prompt, "--prompt", "alice: save pin 1.\\n", "--json", "--max-tokens", "8")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    bad, good = json.loads(out.stdout)
    assert bad["status"] == 400 and reason in bad["error"]
    assert good["status"] == 200


@pytest.mark.parametrize("args, message", [
    (["generate", "--prompt", "hi", "--max-tokens", "0"], "must be a positive whole number"),
    (["generate", "--prompt", "hi", "--max-tokens", "-2"], "must be a positive whole number"),
    (["generate", "--prompt", "hi", "--model", "/nonexistent/dir"], "does not exist"),
    (["info", "--num-pages", "0"], "must be a positive whole number"),
    (["demo", "--scenario", "over-length", "--enable", "kv_crc"], "unknown switch 'kv_crc'"),
    (["demo", "--scenario", "nope"], "invalid choice: 'nope'"),
    (["demo", "--scenario", "over-length", "--secret", "pässword"], "outside letters, digits"),
    (["demo", "--scenario", "over-length", "--secret", "x" * 41], "1 to 40 characters"),
])
def test_bad_arguments_give_one_clear_line(args, message):
    """Bad arguments end with a message naming the problem, exit 2, never a traceback."""
    out = cli(*args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_malformed_model_directory_is_named(tmp_path):
    """A directory whose config.json is not JSON is reported as such."""
    (tmp_path / "config.json").write_text("{not json")
    out = cli("info", "--model", str(tmp_path))
    assert out.returncode == 2 and "cannot read" in out.stderr and "Traceback" not in out.stderr


def test_non_llama_checkpoint_is_refused(tmp_path):
    """A checkpoint of another architecture is refused by name."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    out = cli("info", "--model", str(tmp_path))
    assert out.returncode == 2 and "'gpt2' model" in out.stderr


def test_info_reports_pool_next_to_context():
    """info prints what a startup log shows: KV bytes per token, pool tokens, context window."""
    out = cli("info")
    assert out.returncode == 0, out.stderr
    assert "KV bytes per token: 6,144" in out.stdout
    assert "256 pages x 16 tokens = 4096 tokens" in out.stdout and "context window: 1024 tokens" in out.stdout


def test_demo_json_contract():
    """demo --json prints scenario, switches, victim, attacker and audit, whatever the outcome."""
    out = cli("demo", "--scenario", "over-length", "--preset", "vulnerable", "--secret", "ab 12-x", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == {"scenario", "switches", "victim", "attacker", "audit"}
    assert result["attacker"]["status"] == 200 and "ab 12-x" in result["attacker"]["text"]
    assert result["audit"]["cross_tenant_reads"] > 0 and result["audit"]["pages"]


def test_train_quick_writes_a_transformers_checkpoint(tmp_path):
    """`train --quick` runs every phase and saves what AutoModelForCausalLM/AutoTokenizer load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = cli("train", "--quick", "--out", str(tmp_path / "m"))
    assert out.returncode == 0, out.stderr[-2000:]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert model.config.model_type == "llama" and tok.decode(tok.encode("ab 1-2,")) == "ab 1-2,"


def test_shipped_model_is_small_and_loads_offline():
    """data/tiny-llama is under 20 MB and loads with the Auto classes, no hub involved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minikv.checkpoint import DEFAULT_MODEL_DIR

    size = sum(f.stat().st_size for f in DEFAULT_MODEL_DIR.iterdir())
    assert size <= 20 * 2**20, size
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    assert model.num_parameters() > 1_000_000 and tok.encode("\n") == [0]


def test_demo_enable_without_preset_starts_from_the_vulnerable_engine():
    """demo --enable X alone means "vulnerable plus X": reject_check answers Bob 400, the cluster starts."""
    out = cli("demo", "--scenario", "over-length", "--enable", "reject_check", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [n for n, on in result["switches"].items() if on] == ["reject_check"]
    assert "refused" not in result and result["attacker"]["status"] == 400
