"""What the hardware runs well: mixed precision, thread count and allocator settings, chosen once per process.

Nothing here is tuned to one machine. bf16 autocast is chosen only where the device computes bf16 natively (torch's
own CPU feature probes: AVX512-BF16 or AMX; a CUDA GPU of compute capability 8.0 or more): on a CPU without those
instructions (most laptops, AVX2-only servers) oneDNN emulates bf16 and a training step becomes many times slower
than in fp32.

The CPU runtime settings answer two costs a profile of the demo's training step shows (benchmarks/RESULTS.md, "CPU
runtime for training"): glibc serves allocations over 32 MB, such as the LM's (tokens x vocabulary) logits and their
gradients, with mmap and returns them on free, so every step maps that memory afresh from the kernel (a page fault
per page); and OpenMP threads spinning at barriers keep their cores busy, so a step slows down badly when another
program competes for a core.

This module imports torch only inside functions, so the CLI can apply the environment settings before torch loads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

MIXED_PRECISION = ("auto", "no", "bf16", "fp16")

# oneDNN ISA limits (ONEDNN_MAX_CPU_ISA) below which oneDNN has no native bf16 dot product
_ONEDNN_ISAS_WITHOUT_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)

# OpenMP threads spin this many iterations at a barrier before sleeping (libgomp's default: 300,000). Short spinning
# keeps most of the idle speed and gives a core back quickly when another program needs it.
OMP_SPIN_COUNT = "10000"

# glibc: large blocks from the heap, not mmap; keep up to 2 GiB (the most mallopt's C int can say) of free heap top
_TRIM = "MALLOC_TRIM_THRESHOLD_"
ALLOCATOR_ENVIRONMENT = {"MALLOC_MMAP_MAX_": "0", _TRIM: str(2**31 - 1)}
_MARKER = "ITUNE_RUNTIME_ENVIRONMENT"  # set once the CLI has restarted itself with ALLOCATOR_ENVIRONMENT
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt parameters (malloc.h)


def _oneDNN_limits_bf16() -> bool:
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    return limit.strip().upper() in _ONEDNN_ISAS_WITHOUT_BF16


def native_bf16(device: Any = "cpu") -> bool:
    """Whether `device` computes bf16 matrix products natively (fast), not by emulation.

    Args:
        device: `"cpu"`, `"cuda"` (or `"cuda:N"`, or a `torch.device`); other device types count as not native.
    """
    import torch

    kind = str(device).split(":")[0]
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if kind != "cpu":
        return False
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # x86 (AMX tiles come with AMX-BF16)
    native = any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)
    # the kernels torch dispatches to may be limited below the hardware (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA)
    wide = torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "AVX2")
    return native and wide and not _oneDNN_limits_bf16()


def resolve_mixed_precision(requested: str, device: str = "cpu") -> tuple[str, str]:
    """The precision a run uses, and why (for the log).

    Args:
        requested: One of `MIXED_PRECISION`; `auto` picks bf16 where `device` runs it natively, fp16 on a CUDA GPU
            without native bf16, fp32 (`no`) otherwise.
        device: The device the run trains on.

    Returns:
        (`no`, `bf16` or `fp16`; a one-line reason).
    """
    if requested not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision must be one of {', '.join(MIXED_PRECISION)}, got {requested!r}")
    native = native_bf16(device)
    kind = str(device).split(":")[0]
    if requested == "auto":
        if native:
            return "bf16", f"auto: {device} computes bf16 natively"
        if kind == "cuda":
            return "fp16", f"auto: {device} has no native bf16, fp16 instead"
        return "no", f"auto: {device} has no native bf16 (it would be emulated, many times slower), fp32 instead"
    if requested == "fp16" and kind != "cuda":
        raise ValueError("mixed_precision='fp16' needs a CUDA GPU; on CPU use 'auto', 'bf16' or 'no'")
    if requested == "bf16" and not native:
        warnings.warn(
            f"mixed_precision='bf16' on {device}, which has no native bf16: it is emulated and can be many times "
            "slower than fp32. Use --mixed-precision auto (the default) or no.",
            RuntimeWarning,
            stacklevel=2,
        )
        return "bf16", f"as requested ({device} emulates bf16)"
    return requested, "as requested"


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, further bounded by a cgroup CPU quota (containers)."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max", encoding="ascii").read().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return count


@dataclass
class CPURuntime:
    """What `configure_cpu_runtime` set (printed by the commands)."""

    threads: int
    spin_count: str | None  # OpenMP spin count in force, None if torch was imported before it could be set
    allocator: str  # what the allocator keeps, or why it was left alone

    def describe(self) -> str:
        spin = f"OpenMP spin {self.spin_count}" if self.spin_count else "OpenMP spin unchanged (torch loaded first)"
        return f"{self.threads} CPU threads, {spin}, {self.allocator}"


def set_openmp_environment() -> str | None:
    """Short OpenMP spinning unless the user chose a wait policy (read by OpenMP when torch loads, so only effective
    before `import torch`; the CLI calls this first thing). Returns the setting in force, None if unknown."""
    if "torch" in sys.modules:
        return os.environ.get("GOMP_SPINCOUNT") or os.environ.get("OMP_WAIT_POLICY")
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", OMP_SPIN_COUNT)
    return os.environ.get("GOMP_SPINCOUNT") or f"policy {os.environ['OMP_WAIT_POLICY']}"


def _user_set_allocator() -> bool:
    return any(name.startswith("MALLOC_") or name == "GLIBC_TUNABLES" for name in os.environ if name != _MARKER)


def allocator_environment() -> dict[str, str]:
    """The glibc settings that keep freed memory for reuse, as environment variables (read once, at process start):
    no mmap for large blocks, and a heap top of up to 2 GiB kept instead of returned. Empty where the user set their
    own `MALLOC_*` tunables or the platform is not Linux."""
    if not sys.platform.startswith("linux") or _user_set_allocator():
        return {}
    return dict(ALLOCATOR_ENVIRONMENT)


def process_environment() -> dict[str, str]:
    """What a new process should be started with to run as the CLI runs (`allocator_environment()`, marked as
    applied); empty where there is nothing to set."""
    environment = allocator_environment()
    return {**environment, _MARKER: "1"} if environment else {}


def restart_with_runtime_environment() -> None:
    """Run this program again, once, with `allocator_environment()` in force from the start (what only a new process
    gets: settings made later, through mallopt, leave part of the page faults in place; benchmarks/RESULTS.md, "CPU
    runtime for training"). Does nothing if already done, if there is nothing to set, or where the original command
    line is unknown."""
    environment = process_environment()
    if os.environ.get(_MARKER) or not environment or not getattr(sys, "orig_argv", None):
        return
    os.environ.update(environment)
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError:  # not fatal: the mallopt fallback in configure_cpu_runtime still applies
        return


def _keep_freed_memory() -> str:
    """Make glibc serve large blocks from its heap and keep freed memory for reuse (no mmap/munmap per tensor).

    Peak memory is unchanged (the same blocks are reused step after step); memory freed at the end of a phase is
    kept by the process instead of returned to the system. Set from the start (the CLI's restart) where possible,
    else through mallopt now; skipped where the user set MALLOC_* tunables.
    """
    if os.environ.get(_MARKER) and all(os.environ.get(k) == v for k, v in ALLOCATOR_ENVIRONMENT.items()):
        return "freed memory kept for reuse (glibc tunables from the start)"
    if _user_set_allocator():
        return "allocator as set in the environment"
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return "allocator unchanged (not glibc)"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    kept = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, int(ALLOCATOR_ENVIRONMENT[_TRIM])) == 1
    return "freed memory kept for reuse (mallopt, set late: partial)" if kept else "allocator unchanged"


_configured: CPURuntime | None = None


def configure_cpu_runtime() -> CPURuntime:
    """Apply the CPU settings for a process that computes on the CPU, once (later calls return the first result).

    Threads: `available_cpus()` unless OMP_NUM_THREADS is set. OpenMP: `set_openmp_environment()` (effective only
    if it ran before torch was imported, as the CLI does). Allocator: see `_keep_freed_memory`.
    """
    global _configured
    if _configured is not None:
        return _configured
    spin = set_openmp_environment()
    allocator = _keep_freed_memory() if sys.platform.startswith("linux") else "allocator unchanged"
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        threads = available_cpus()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    _configured = CPURuntime(threads=torch.get_num_threads(), spin_count=spin, allocator=allocator)
    return _configured
