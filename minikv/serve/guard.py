"""`python minikv/serve/guard.py -- COMMAND...`: run COMMAND in a process group of its own and kill that
whole group when the guard's parent dies: a server in a session of its own (vLLM and its engine processes)
would otherwise outlive a SIGKILLed parent. Linux's PR_SET_PDEATHSIG fires when the *thread* that started the
guard ends: start it from one that lives as long as the server should."""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STOP_GRACE_S = 15.0  # what the command gets to exit after a SIGTERM before its group is killed


def guarded(command: list[str]) -> list[str]:
    """`command` under the guard, run as a file: it imports only the standard library, whatever PYTHONPATH."""
    return [sys.executable, __file__, "--", *command]


def main(argv: list[str]) -> int:
    """Run the command in a group of its own; when it exits, or on SIGTERM or the parent's death (after
    passing the SIGTERM on), kill that whole group. The command's exit status."""
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: guard.py -- COMMAND...", file=sys.stderr)
        return 2
    parent = os.getppid()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM (or the parent's death) interrupts
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        print(f"guard: prctl failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 2
    if os.getppid() != parent:  # the parent died before the guard was set: start nothing
        return 1
    child = subprocess.Popen(argv[1:], start_new_session=True)
    try:
        status = child.wait()
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop at a time
        child.terminate()
        try:
            status = child.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            status = -signal.SIGKILL
    try:
        os.killpg(child.pid, signal.SIGKILL)  # whatever the command left behind: its engine processes
    except ProcessLookupError:
        pass
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
