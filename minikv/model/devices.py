"""Which device runs the engine, and how much memory it has free: the one place a device name is read, so
a device this machine lacks or one that holds no data ("meta") is refused before anything loads."""

import torch

DEVICE_CHOICES = "cpu, cuda, cuda:N or mps"


class DeviceError(ValueError):
    """A device name this machine cannot run the engine on; the message says why."""


def pick_device(name: str | torch.device | None = None) -> torch.device:
    """The device asked for, checked to exist here; by default CUDA when present, else the CPU."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = f"device {str(name)!r}"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise DeviceError(f"unknown {dev}: use {DEVICE_CHOICES}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"{dev}: this machine's torch ({torch.__version__}) sees no CUDA GPU; use cpu")
    if device.type == "cuda" and (device.index or 0) >= (count := torch.cuda.device_count()):
        raise DeviceError(f"{dev}: this machine has {count} CUDA device(s), numbered 0 to {count - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"{dev}: Apple's Metal backend (mps) is not available here; use cpu")
    if device.type == "meta":
        raise DeviceError(f"{dev} holds tensor shapes but no data: it runs no model; use {DEVICE_CHOICES}")
    if device.type not in ("cpu", "cuda", "mps"):
        raise DeviceError(f"{dev} ({device.type}) is not supported: use {DEVICE_CHOICES}")
    return device


def available_memory_bytes(device: torch.device) -> int | None:
    """Bytes that can still be allocated on `device`, or None when this machine does not say."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:  # Linux: MemAvailable counts reclaimable caches too
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):  # elsewhere: unknown (the allocator's refusal still names the numbers)
        return None
