"""What the kernel says about another process: its CPU time and resident memory (Linux /proc).

CPU time is the kernel's per-process counter (every thread, also exited ones), the one that
/proc/<pid>/stat shows as utime + stime in clock ticks. Read through the process's CPU clock it
comes to the nanosecond; /proc/<pid>/stat is read too, as a cross-check, and as the fallback
where that clock cannot be read.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_CPUCLOCK_SCHED = 2  # the kernel's CPUCLOCK_SCHED: the scheduler's exact runtime of the whole process


class ProcessGoneError(RuntimeError):
    """The process exited (or never existed): nothing more can be read about it."""


@dataclass(frozen=True)
class CpuReading:
    seconds: float  # utime + stime, to the nanosecond where the CPU clock could be read
    ticks: int  # utime + stime from /proc/<pid>/stat, in clock ticks (the cross-check)


def parse_stat_ticks(stat_text: str) -> int:
    """utime + stime (clock ticks) from the text of /proc/<pid>/stat.

    The command name (field 2) is in parentheses and may itself hold spaces or parentheses, so
    the fields are counted from the last ")": utime and stime are fields 14 and 15 overall.
    """
    _, closing, rest = stat_text.rpartition(")")
    if not closing:
        raise ValueError("not a /proc/<pid>/stat line: no ')' after the command name")
    fields = rest.split()
    if len(fields) < 13:
        raise ValueError(f"not a /proc/<pid>/stat line: {len(fields)} fields after the command name")
    # rest starts at field 3 (state), so field N is rest[N - 3].
    return int(fields[11]) + int(fields[12])


def parse_stat_comm(stat_text: str) -> str:
    """The command name (field 2, without its parentheses) from /proc/<pid>/stat or a thread's stat."""
    opening, closing = stat_text.find("("), stat_text.rfind(")")
    if opening < 0 or closing < opening:
        raise ValueError("not a /proc/<pid>/stat line: no command name in parentheses")
    return stat_text[opening + 1 : closing]


def parse_schedstat_seconds(schedstat_text: str) -> float:
    """Time on the CPU (first field, nanoseconds) from a /proc/.../schedstat line, in seconds."""
    fields = schedstat_text.split()
    if not fields or not fields[0].isdigit():
        raise ValueError(f"not a schedstat line: {schedstat_text!r}")
    return int(fields[0]) / 1e9


def parse_vm_rss_kib(status_text: str) -> int:
    """VmRSS (KiB) from the text of /proc/<pid>/status."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) < 2 or not parts[1].isdigit():
                break
            return int(parts[1])
    raise ValueError("no VmRSS line in /proc/<pid>/status (a kernel thread, or a process that is exiting)")


def parse_rss_parts_kib(status_text: str) -> dict[str, int]:
    """RssAnon, RssFile and RssShmem (KiB) from the text of /proc/<pid>/status: what of VmRSS is the
    process's own memory, and what is mapped from files (shared libraries: how much of them is
    resident depends on the page cache, not on the process). Those the kernel does not report are left out."""
    parts = {}
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name in ("RssAnon", "RssFile", "RssShmem") and value.split() and value.split()[0].isdigit():
            parts[name] = int(value.split()[0])
    return parts


def process_cpu_clock(pid: int) -> int:
    """The clock id of `pid`'s process-wide CPU clock (what glibc's clock_getcpuclockid returns)."""
    return ((~pid) << 3) | _CPUCLOCK_SCHED


def cpu(pid: int) -> CpuReading:
    """`pid`'s CPU time so far (user + system, every thread)."""
    ticks = parse_stat_ticks(_read(pid, "stat"))
    try:
        seconds = time.clock_gettime(process_cpu_clock(pid))
    except OSError:
        seconds = ticks / CLOCK_TICKS  # no CPU clock for other processes here: tick resolution
    return CpuReading(seconds=seconds, ticks=ticks)


@dataclass(frozen=True)
class ThreadCpu:
    name: str  # the thread's command name: the process's own unless the thread set one (gRPC does)
    seconds: float  # its time on the CPU so far (nanosecond schedstat; clock ticks where there is none)


def thread_cpu(pid: int) -> dict[int, ThreadCpu]:
    """CPU time of each live thread of `pid`, by thread id (threads that exited are not listed)."""
    threads: dict[int, ThreadCpu] = {}
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError as exc:
        raise ProcessGoneError(f"process {pid} is gone") from exc
    for tid in tids:
        try:
            stat = _read(pid, f"task/{tid}/stat")
            try:
                seconds = parse_schedstat_seconds(_read(pid, f"task/{tid}/schedstat"))
            except (ProcessGoneError, ValueError):
                seconds = parse_stat_ticks(stat) / CLOCK_TICKS
        except ProcessGoneError:
            continue  # the thread ended between the listing and the read
        threads[tid] = ThreadCpu(name=parse_stat_comm(stat), seconds=seconds)
    return threads


def thread_shares(
    pid: int, before: dict[int, ThreadCpu], after: dict[int, ThreadCpu], roles: tuple[str, ...]
) -> dict[str, float]:
    """CPU seconds per thread role between two `thread_cpu` readings of process `pid`.

    Threads without a name of their own are the process's Python threads: the main thread (its
    id is the pid), then `roles` in the order they were started (thread ids grow with creation),
    then "other". Threads that named themselves (a library's native threads) go by that name.
    """
    own_name = after[pid].name if pid in after else None
    unnamed = sorted(tid for tid, thread in after.items() if tid != pid and thread.name == own_name)
    role_of = {pid: "main", **{tid: (roles[i] if i < len(roles) else "other") for i, tid in enumerate(unnamed)}}
    shares: dict[str, float] = {}
    for tid, thread in after.items():
        role = role_of.get(tid, thread.name)
        spent = thread.seconds - (before[tid].seconds if tid in before else 0.0)
        shares[role] = shares.get(role, 0.0) + spent
    return shares


def rss_mb(pid: int) -> float:
    """`pid`'s resident set size now, in MB (MiB, as VmRSS counts it)."""
    return parse_vm_rss_kib(_read(pid, "status")) / 1024


def rss_parts_mb(pid: int) -> dict[str, float]:
    """`pid`'s RssAnon, RssFile and RssShmem now, in MB (see `parse_rss_parts_kib`)."""
    return {name: kib / 1024 for name, kib in parse_rss_parts_kib(_read(pid, "status")).items()}


def _read(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGoneError(f"process {pid} is gone") from exc
