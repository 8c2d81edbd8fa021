"""Everything a GPU should confirm, in one command and one JSON report: `python scripts/gpu_check.py`.

    python scripts/gpu_check.py                        # on CUDA: equivalence tests, the leak and its fixes,
                                                       # every notebook (strict nbval), bench --quick --json
    python scripts/gpu_check.py --device cpu           # a dry run of the CPU-safe parts (the audit's
                                                       # equivalence test, the late-write leak and its fix)
    python scripts/gpu_check.py --out report.json

The model loads on CUDA whenever it is present (`load_model`), so the tests, the demos and the notebooks
run there unchanged. Each part runs as a subprocess; the report says, per part, its command, exit status,
seconds, last lines of output and, for the leak, the audit's verdict. Exit status 0 when every part
passed, 1 otherwise, 2 when there is no CUDA (one line says what is needed).
"""

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENCE = ["tests/test_equivalence.py", "tests/test_paged_attention.py", "tests/test_audit.py",
               "tests/test_prefix_cache.py", "tests/test_chunked_prefill.py"]


@dataclass
class Part:
    """One check: what ran, how it ended, what it showed."""

    name: str
    command: list[str]
    expect_leak: bool | None = None  # for a demo: whether the audit must see cross-tenant reads
    returncode: int | None = None
    seconds: float = 0.0
    tail: str = ""
    verdict: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        if self.returncode != 0:
            return False
        if self.expect_leak is None:
            return True
        return (self.verdict.get("cross_tenant_reads", 0) > 0) == self.expect_leak

    def run(self) -> None:
        started = time.perf_counter()
        done = subprocess.run(self.command, cwd=ROOT, capture_output=True, text=True)
        self.returncode, self.seconds = done.returncode, round(time.perf_counter() - started, 1)
        self.tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        if self.expect_leak is not None and done.returncode == 0:
            result = json.loads(done.stdout)
            self.verdict = {**result["audit"], "refused": result.get("refused")}


def demo(preset: str, device: str, expect_leak: bool) -> Part:
    return Part(f"late-write leak, {preset} preset", [sys.executable, "-m", "minikv", "demo", "--scenario",
                                                        "late-write", "--preset", preset, "--json", "--device",
                                                        device], expect_leak)


def parts(device: str) -> list[Part]:
    """On CUDA every part; on a CPU the dry run: the audit's equivalence test and the leak with its fix."""
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    leak = [demo("vulnerable", device, True), demo("safe", device, False)]
    if device == "cpu":
        return [Part("equivalence (dry run: the audit)", [*pytest, "tests/test_audit.py"]), *leak]
    notebooks = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    return [Part("equivalence tests", [*pytest, *EQUIVALENCE]), *leak,
            Part("notebooks (strict nbval)", [*pytest, *notebooks]),
            Part("bench", [sys.executable, "-m", "minikv", "bench", "--quick", "--json", "--device", device])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cuda (default): everything; cpu: a dry run of the CPU-safe parts")
    parser.add_argument("--out", default="gpu_check.json", help="where the JSON report goes (default %(default)s)")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check needs a CUDA GPU (torch.cuda.is_available() is False here); "
              "--device cpu runs a dry run of its CPU-safe parts", file=sys.stderr)
        return 2
    checks = parts(args.device)
    for part in checks:
        print(f"{part.name} ...", file=sys.stderr, flush=True)
        part.run()
        print(f"  {'ok' if part.ok else 'FAILED'} in {part.seconds:.0f} s", file=sys.stderr, flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (dry run)"
    report = {"device": device, "passed": all(p.ok for p in checks),
              "parts": [{**asdict(p), "ok": p.ok} for p in checks]}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'all parts passed' if report['passed'] else 'some parts failed'}; report: {args.out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
