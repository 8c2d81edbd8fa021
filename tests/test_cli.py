"""`python -m minikv`: the JSON contract, and a clear one-line error for every bad input.

Most tests call `main()` in this process: the same parser and commands, without the 5 s a fresh
interpreter spends importing torch and transformers. A child process runs where the process itself
is the point: generate's JSON on stdout, prompt bytes on the command line, and train.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m minikv ARGS` in a child process."""
    return subprocess.run([sys.executable, "-m", "minikv", *args], capture_output=True, text=True, timeout=300)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """`python -m minikv ARGS` in this process (argparse's own exit included): exit status, stdout, stderr."""
    from minikv.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:  # argparse refuses an argument by exiting
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_generate_json_contract():
    """generate --json prints one response per prompt with exactly the promised fields: usage counted as the
    character tokenizer counts by hand (the reply's EOS included), a time to first token within the run's."""
    prompts = ["alice: save pin 0912.\n", "bob: save memo hi.\n"]
    start = time.perf_counter()
    out = cli("generate", *(a for p in prompts for a in ("--prompt", p.replace("\n", "\\n"))), "--json",
              "--max-tokens", "24")
    wall_s = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    responses = json.loads(out.stdout)
    assert [r["text"] for r in responses] == ["saved pin 0912.", "saved memo hi."]
    for prompt, r in zip(prompts, responses):
        assert set(r) == {"status", "text", "usage", "ttft_s", "error"}
        assert r["status"] == 200 and r["error"] is None and 0 < r["ttft_s"] < wall_s
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(r["text"]) + 1, "cached_tokens": 0}
        assert r["usage"] == usage


@pytest.mark.parametrize("prompt, reason", [
    ("", "empty prompt"),
    ("x" * 1100, "context window is 1024"),
    ("héllo", "outside the model's vocabulary"),
])
def test_bad_prompt_is_a_400_in_json_and_exit_1(capsys, prompt, reason):
    """A bad prompt gets status 400 with its reason; the others are still served; exit 1."""
    code, out, err = run_main(capsys, "generate", "--prompt", prompt, "--prompt", "alice: save pin 1.\\n", "--json",
                              "--max-tokens", "8")
    assert code == 1 and "Traceback" not in err
    bad, good = json.loads(out)
    assert bad["status"] == 400 and reason in bad["error"]
    assert good["status"] == 200


@pytest.mark.parametrize("args, message", [
    (["generate", "--prompt", "hi", "--max-tokens", "0"], "must be a positive whole number"),
    (["generate", "--prompt", "hi", "--max-tokens", "-2"], "must be a positive whole number"),
    (["generate", "--prompt", "hi", "--model", "/nonexistent/dir"], "does not exist"),
    (["info", "--num-pages", "0"], "must be a positive whole number"),
    (["serve", "--max-batch", "257"], "--max-batch 257: 256 pages run at most 256 requests; give 1 to 256"),
    (["serve", "--max-batch", "8", "--disagg"], "--max-batch 8: the pair has no batch limit"),
    (["bench", "--max-batch", "0"], "must be a positive whole number"),
    (["demo", "--scenario", "over-length", "--enable", "kv_crc"], "unknown switch 'kv_crc'"),
    (["demo", "--scenario", "nope"], "invalid choice: 'nope'"),
    (["demo", "--scenario", "over-length", "--secret", "pässword"], "outside letters, digits"),
    (["demo", "--scenario", "over-length", "--secret", "x" * 41], "1 to 40 characters"),
])
def test_bad_arguments_give_one_clear_line(capsys, args, message):
    """Bad arguments end with a message naming the problem, exit 2, never a traceback."""
    code, _, err = run_main(capsys, *args)
    assert code == 2 and message in err and "Traceback" not in err


def test_malformed_model_directory_is_named(capsys, tmp_path):
    """A directory whose config.json is not JSON is reported as such."""
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = run_main(capsys, "info", "--model", str(tmp_path))
    assert code == 2 and "cannot read" in err and "Traceback" not in err


def test_non_llama_checkpoint_is_refused(capsys, tmp_path):
    """A checkpoint of another architecture is refused by name."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    code, _, err = run_main(capsys, "info", "--model", str(tmp_path))
    assert code == 2 and "'gpt2' model" in err


def test_info_reports_pool_next_to_context(capsys):
    """info prints what a startup log shows: KV bytes per token, pool tokens, context window."""
    code, out, err = run_main(capsys, "info")
    assert code == 0, err
    assert "KV bytes per token: 6,144" in out
    assert "256 pages x 16 tokens = 4096 tokens" in out and "context window: 1024 tokens" in out


def test_demo_json_contract(capsys):
    """demo --json prints scenario, switches, victim, attacker and audit, whatever the outcome."""
    code, out, err = run_main(capsys, "demo", "--scenario", "over-length", "--preset", "vulnerable", "--secret", "ab 12-x",
                              "--json")
    assert code == 0, err
    result = json.loads(out)
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

    from minikv.model.checkpoint import DEFAULT_MODEL_DIR

    size = sum(f.stat().st_size for f in DEFAULT_MODEL_DIR.iterdir())
    assert size <= 20 * 2**20, size
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    assert model.num_parameters() > 1_000_000 and tok.encode("\n") == [0]


# -- bad inputs, in process: each ends with one `error:` line and exit 2 -------------------------
def one_error_line(err: str) -> str:
    """The single `error: ...` line a bad input must produce (and nothing else on stderr)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def absent_devices() -> list[str]:
    """Device names this machine cannot run on (which ones depends on the machine)."""
    import torch

    names = [f"cuda:{torch.cuda.device_count()}", "foo"]
    if not torch.cuda.is_available():
        names.append("cuda")
    if not torch.backends.mps.is_available():
        names.append("mps")
    return names


@pytest.mark.parametrize("device", absent_devices())
def test_info_on_an_absent_device_is_one_line(capsys, device):
    """info --device cuda / cuda:N / mps / foo on a machine without it: one line naming the device."""
    code, _, err = run_main(capsys, "info", "--device", device)
    assert code == 2 and f"'{device}'" in one_error_line(err)


def test_generate_on_meta_device_is_one_line(capsys):
    """generate --device meta is refused: meta holds no data."""
    code, _, err = run_main(capsys, "generate", "--prompt", "hi\\n", "--device", "meta")
    assert code == 2 and "'meta' holds tensor shapes but no data" in one_error_line(err)


def test_pool_larger_than_memory_says_bytes_needed_and_available(capsys):
    """info --num-pages 1000000000 names the bytes the pool needs and the bytes there are."""
    code, _, err = run_main(capsys, "info", "--num-pages", "1000000000")
    line = one_error_line(err)
    assert code == 2 and "needs 98,304,000,000,000 bytes" in line and "bytes available" in line


@pytest.mark.parametrize("prompt, reason", [
    (b"ab\xff\xfecd", "not valid UTF-8: byte 0xFF at character 2"),
    (bytes(range(1, 256)), "not valid UTF-8: byte 0x80 at character 127"),  # a binary file's bytes (argv has no NUL)
], ids=["invalid-utf8", "binary-file"])
def test_undecodable_prompt_is_a_400_not_a_traceback(prompt, reason):
    """A prompt of invalid UTF-8 bytes on the command line is a 400 with the byte named; the rest is served."""
    out = subprocess.run([sys.executable, "-m", "minikv", "generate", "--prompt", prompt, "--prompt",
                          "alice: save pin 1.\\n", "--json", "--max-tokens", "4"], capture_output=True, timeout=300)
    assert out.returncode == 1 and b"Traceback" not in out.stderr
    bad, good = json.loads(out.stdout)
    assert bad["status"] == 400 and reason in bad["error"] and good["status"] == 200


@pytest.fixture
def bench_calls(monkeypatch) -> list:
    """Replace the benchmark by a recorder: a test sees whether it would have run, and nothing runs."""
    import minikv.bench.benchmark as benchmark

    calls: list = []
    monkeypatch.setattr(benchmark, "run_command", lambda model, tok, args: calls.append(args) or 0)
    return calls


@pytest.mark.parametrize("plot, reason", [
    ("/nonexistent/dir/x.png", "folder /nonexistent/dir does not exist"),
    ("figure.docx", "unsupported figure format '.docx'"),
    ("figure", "unsupported figure format '(none)'"),
])
def test_bad_plot_path_fails_before_the_benchmark(capsys, bench_calls, plot, reason):
    """bench --plot to a missing folder or an unknown format fails at once, the benchmark never started."""
    code, _, err = run_main(capsys, "bench", "--quick", "--plot", plot)
    assert code == 2 and reason in one_error_line(err) and bench_calls == []


def test_bench_threads_are_bounded_by_the_cores(capsys, bench_calls):
    """bench --threads 100000 is refused with the core count (it used to segfault in OpenMP)."""
    code, _, err = run_main(capsys, "bench", "--threads", "100000")
    assert code == 2 and "CPU core(s)" in one_error_line(err) and bench_calls == []


@pytest.fixture
def train_calls(monkeypatch) -> list:
    """Replace training by a recorder of where it would write: nothing is trained or overwritten."""
    import minikv.training.train as training

    calls: list = []
    monkeypatch.setattr(training, "train", lambda cfg, out, resume_from=None: calls.append(out))
    return calls


def test_train_without_out_refuses_and_writes_nothing(capsys, train_calls):
    """train --quick with no --out is refused: it used to overwrite the shipped data/tiny-llama."""
    code, _, err = run_main(capsys, "train", "--quick")
    assert code == 2 and "train needs --out DIR" in one_error_line(err) and train_calls == []


def test_train_into_the_shipped_model_needs_overwrite_shipped(capsys, train_calls):
    """--out data/tiny-llama alone is refused; with --overwrite-shipped it is allowed."""
    from minikv.model.checkpoint import DEFAULT_MODEL_DIR

    code, _, err = run_main(capsys, "train", "--quick", "--out", str(DEFAULT_MODEL_DIR))
    assert code == 2 and "--overwrite-shipped" in one_error_line(err) and train_calls == []
    code, _, _ = run_main(capsys, "train", "--quick", "--out", str(DEFAULT_MODEL_DIR), "--overwrite-shipped")
    assert code == 0 and train_calls == [DEFAULT_MODEL_DIR]


def test_model_path_that_is_a_file_says_so(capsys):
    """--model FILE says it is a file, not that it does not exist."""
    from minikv.model.checkpoint import DEFAULT_MODEL_DIR

    code, _, err = run_main(capsys, "info", "--model", str(DEFAULT_MODEL_DIR / "config.json"))
    assert code == 2 and "is a file; give the checkpoint's directory" in one_error_line(err)


def test_info_names_minikv_model_rather_than_shipped(capsys, monkeypatch, tmp_path):
    """With MINIKV_MODEL set, info names that directory, not "(shipped)"."""
    import shutil

    from minikv.model.checkpoint import DEFAULT_MODEL_DIR

    shutil.copytree(DEFAULT_MODEL_DIR, tmp_path / "mine")
    monkeypatch.setenv("MINIKV_MODEL", str(tmp_path / "mine"))
    code, out, _ = run_main(capsys, "info")
    assert code == 0 and f"model: {tmp_path / 'mine'} (from MINIKV_MODEL)" in out and "shipped" not in out


def test_mismatched_checkpoint_is_one_line(capsys, altered_checkpoint):
    """A config.json claiming 2 layers over 4-layer weights is refused by the CLI in one line."""
    path = altered_checkpoint(num_hidden_layers=2)
    code, _, err = run_main(capsys, "info", "--model", str(path))
    assert code == 2 and "num_hidden_layers=2 but the weights hold 4 layers" in one_error_line(err)


def test_demo_prefix_probe_json_recovers_the_secret_and_safe_recovers_nothing(capsys):
    """prefix-probe: vulnerable recovers --secret exactly from cached_tokens; safe recovers nothing."""
    code, out, err = run_main(capsys, "demo", "--scenario", "prefix-probe", "--preset", "vulnerable", "--secret", "k9Q",
                              "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["recovered"] == "k9Q" and isinstance(data["probes"], int) and data["probes"] >= 4 * 66
    assert data["audit"]["cross_tenant_reads"] == 0 and data["audit"]["cross_tenant_cache_hits"] > 0
    assert data["attacker"]["usage"]["cached_tokens"] > 0
    safe = json.loads(run_main(capsys, "demo", "--scenario", "prefix-probe", "--preset", "safe", "--secret", "k9Q",
                               "--json")[1])
    assert safe["recovered"] == "" and safe["audit"]["cross_tenant_cache_hits"] == 0


def test_demo_enable_without_preset_starts_from_the_vulnerable_engine(capsys):
    """demo --enable X alone means "vulnerable plus X": reject_check answers Bob 400, the cluster starts."""
    code, out, err = run_main(capsys, "demo", "--scenario", "over-length", "--enable", "reject_check", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [n for n, on in result["switches"].items() if on] == ["reject_check"]
    assert "refused" not in result and result["attacker"]["status"] == 400
