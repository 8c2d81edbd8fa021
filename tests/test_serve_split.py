"""The core on a thread against in a process (`scripts/profile_serve.py --split`): a short real run attributes
every CPU second to its part and no more than the machine had, and the picture's parts add up to its bar."""

import json
import os
import subprocess
import sys
from pathlib import Path

from minikv.bench.plot import SPLIT_RECORD, split_figure, split_parts

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "profile_serve.py"


def test_a_short_split_run_attributes_the_cpu_to_each_part(tmp_path):
    """Both servers up, a round each: the engine core, the HTTP side and the clients each spent CPU time, in
    both ways of running the core, and all of it fits in the machine's cores over the wall time."""
    out, png = tmp_path / "split.json", tmp_path / "split.png"
    done = subprocess.run([sys.executable, str(SCRIPT), "--split", "--clients", "4", "--rounds", "1", "--requests",
                           "16", "--out", str(out), "--figure", str(png), "--", "--num-pages", "256"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[1])})
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    rounds = record["rounds"]["4"]
    assert [r["core"] for r in rounds] == ["thread", "process"]
    for r in rounds:
        spent = [r["engine_core_cpu_s"], r["http_cpu_s"], r["clients_cpu_s"]]
        assert min(spent) > 0, r  # a part read as 0: its threads were not found
        assert sum(spent) <= record["cores"] * r["wall_s"] * 1.05 + 0.05, r  # /proc's ticks are 10 ms
    assert png.stat().st_size > 10_000


def test_the_recorded_picture_adds_up():
    """Each bar of the committed record is the machine's time per token, its parts and the unused rest."""
    record = json.loads(SPLIT_RECORD.read_text())
    for clients, rounds in record["rounds"].items():
        parts = split_parts(rounds, record["cores"])
        for core, p in parts.items():
            mine = [r for r in rounds if r["core"] == core]
            assert len(mine) == len(rounds) // 2
            total = p["engine_core_cpu_s"] + p["http_cpu_s"] + p["clients_cpu_s"] + p["rest"]
            assert abs(total - p["machine"]) < 1e-9 and p["rest"] >= 0
    fig = split_figure(record)
    widths = [sum(bar.get_width() for bar in ax.patches[i::2]) for ax in fig.axes for i in (0, 1)]
    machine = [split_parts(rounds, record["cores"])[core]["machine"]
               for rounds in record["rounds"].values() for core in ("thread", "process")]
    assert all(abs(w - m) < 1e-9 for w, m in zip(widths, machine, strict=True))
