"""What the process tests share: whether a pid is still a live process."""


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (read from /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False
