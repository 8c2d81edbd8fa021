"""A server started in a session of its own (`peer serve vllm`) dies with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from minikv.serve.guard import guarded

# The parent: starts a stand-in server (a shell and two grandchildren, as vLLM's API server and engines)
# under the guard, prints the stand-in's process group, then waits to be killed.
PARENT = """
import subprocess, sys, time
from minikv.serve.guard import guarded
stand_in = ["sh", "-c", "sleep 300 & sleep 300 & echo $$; wait"]
p = subprocess.Popen(guarded(stand_in), stdout=subprocess.PIPE, text=True, start_new_session=True)
print(p.stdout.readline().strip(), flush=True)
time.sleep(300)
"""


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp
            members.append(int(stat.parent.name))
    return members


def test_sigkill_of_the_parent_ends_the_whole_stand_in_group():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        pgid = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while len(group_members(pgid)) < 3 and time.monotonic() < deadline:  # the shell and its two sleeps
            time.sleep(0.05)
        assert len(group_members(pgid)) == 3
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert group_members(pgid) == []
    finally:
        parent.kill()
        for pid in group_members(pgid) if "pgid" in locals() else []:
            os.kill(pid, signal.SIGKILL)


def test_the_guard_passes_sigterm_on_and_returns_the_status():
    """SIGTERM to the guard: the command gets it and exits; the guard exits with the command's status."""
    command = [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: "
               "sys.exit(3)); print('up', flush=True); time.sleep(60)"]
    guard = subprocess.Popen(guarded(command), stdout=subprocess.PIPE, text=True)
    assert guard.stdout.readline().strip() == "up"
    guard.send_signal(signal.SIGTERM)
    assert guard.wait(20) == 3
