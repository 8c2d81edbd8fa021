"""scripts/gpu_check.py: one line and a non-zero exit without CUDA; its CPU dry run, report and verdicts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run")
def test_without_cuda_it_says_what_it_needs_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "r.json")], capture_output=True,
                          text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "needs a CUDA GPU" in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_cpu_dry_run_reports_the_leak_and_its_fix(tmp_path):
    """The dry run passes the audit's equivalence test, sees the late-write leak on the vulnerable preset and
    none on the safe one, and writes it all in one report."""
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out)], capture_output=True,
                          text=True)
    report = json.loads(out.read_text())
    assert done.returncode == 0 and report["passed"], done.stderr
    vulnerable, safe = report["parts"][1:]
    assert vulnerable["verdict"]["cross_tenant_reads"] > 0 and safe["verdict"]["cross_tenant_reads"] == 0
    assert [p["returncode"] for p in report["parts"]] == [0, 0, 0]
