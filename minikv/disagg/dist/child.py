"""What every child process of minikv does (the pair's two workers, serve's engine core): leave the process
group's signals to its parent, watch that the parent still lives, report at least every HEARTBEAT_S, and exit
without the interpreter's teardown once what it said has reached the parent."""

import os
import signal

HEARTBEAT_S = 1.0  # a child reports at least this often, busy or idle: its parent's sign of life
STALL_S = 10.0  # a child silent this long has stopped answering (hung, or stopped by a debugger)


def ignore_group_signals() -> None:
    """Ctrl-C (and a process manager's SIGTERM) reach the whole group: the parent stops us in order."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def parent_alive(parent_pid: int) -> bool:
    """False once the parent has gone (even by SIGKILL): this process is then the init process's child."""
    return os.getppid() == parent_pid


def exit_now(outbox) -> None:
    """Flush `outbox` (a multiprocessing queue) to the parent, then exit at once: skipping the interpreter's
    teardown saves about 2 s of library exit hooks, none of them ours."""
    outbox.close()
    outbox.join_thread()
    os._exit(0)
