"""Transparent huge pages for a worker's memory (the ``huge_pages`` setting).

With 4 KiB pages, a training process's arrays land on whatever pages it gets, and on a
virtual machine the cost of their address translation differs from one process to the next:
on this project's 2-vCPU VM, about one worker in four trained 15-25% slower for its whole life
(docs/performance.md, "Gate power on real noise"). With ``huge_pages = "transparent"`` the
worker starts with PyTorch's CPU allocator asking for transparent huge pages for its large
blocks (``THP_MEM_ALLOC_ENABLE``) and glibc's malloc doing the same for the blocks it maps
(``glibc.malloc.hugetlb=1``, glibc 2.35 or newer), which works where the kernel's THP mode is
``always`` or ``madvise``. Both are read when the process starts, so they are set in the
worker's environment; the result records the huge-page memory the worker held.
"""

from __future__ import annotations

import re
from pathlib import Path

HUGE_PAGES = ("off", "transparent")
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_TUNABLE = "glibc.malloc.hugetlb=1"


def worker_env(mode: str, env: dict[str, str]) -> dict[str, str]:
    """The variables to add to a worker's environment ``env`` for ``mode``."""
    if mode == "off":
        return {}
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.hugetlb")]
    return {"THP_MEM_ALLOC_ENABLE": "1", "GLIBC_TUNABLES": ":".join([*tunables, _TUNABLE])}


def kernel_mode() -> str | None:
    """The kernel's THP mode (``always``, ``madvise`` or ``never``), or None without THP."""
    try:
        m = re.search(r"\[(\w+)\]", THP_SETTING.read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def unavailable(mode: str) -> str | None:
    """Why ``mode`` cannot be had on this machine, or None."""
    if mode == "off":
        return None
    found = kernel_mode()
    if found is None:
        return f"huge_pages = {mode}: this system has no transparent huge pages ({THP_SETTING} is missing)"
    if found == "never":
        return f"huge_pages = {mode}: transparent huge pages are off on this machine ({THP_SETTING}: never)"
    return None


def anon_huge_bytes() -> int | None:
    """The anonymous memory this process holds in huge pages (Linux), or None where unknown."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return None
    m = re.search(r"^AnonHugePages:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None
