"""Reading another process's CPU time and memory from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from bench.proc import (
    CLOCK_TICKS,
    ProcessGoneError,
    ThreadCpu,
    cpu,
    parse_rss_parts_kib,
    parse_schedstat_seconds,
    parse_stat_comm,
    parse_stat_ticks,
    parse_vm_rss_kib,
    rss_mb,
    rss_parts_mb,
    thread_cpu,
    thread_shares,
)

# /proc/<pid>/stat of a thread whose name holds a space and a parenthesis; utime 1234, stime 56.
STAT = (
    "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 1200 0 0 0 1234 56 7 8 20 0 5 0 "
    "2401802 123456789 8000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
)


def test_stat_ticks_are_utime_plus_stime_counted_after_the_command_name() -> None:
    # WHEN the stat line of a process with an awkward name is parsed
    ticks = parse_stat_ticks(STAT)
    # THEN fields 14 and 15 are added, not fields shifted by the spaces in the name
    assert ticks == 1234 + 56


def test_stat_ticks_refuse_text_that_is_not_a_stat_line() -> None:
    with pytest.raises(ValueError, match="no '\\)'"):
        parse_stat_ticks("4242 S 1 2 3")
    with pytest.raises(ValueError, match="fields"):
        parse_stat_ticks("4242 (short) S 1 2")


def test_vm_rss_is_read_from_its_line_in_kib() -> None:
    status = "Name:\tmbridge\nVmPeak:\t  99999 kB\nVmRSS:\t   33280 kB\nRssAnon:\t  20000 kB\n"
    assert parse_vm_rss_kib(status) == 33280


def test_the_parts_of_rss_are_read_from_their_lines_in_kib() -> None:
    status = "VmRSS:\t   33280 kB\nRssAnon:\t  20000 kB\nRssFile:\t  13000 kB\nRssShmem:\t     280 kB\n"
    assert parse_rss_parts_kib(status) == {"RssAnon": 20000, "RssFile": 13000, "RssShmem": 280}
    # a kernel without them (before 4.5) reports none
    assert parse_rss_parts_kib("VmRSS:\t   33280 kB\n") == {}


def test_the_parts_of_this_processs_rss_add_up_to_it() -> None:
    parts = rss_parts_mb(os.getpid())
    assert set(parts) == {"RssAnon", "RssFile", "RssShmem"}
    assert abs(sum(parts.values()) - rss_mb(os.getpid())) < 2.0


def test_vm_rss_missing_is_an_error() -> None:
    # GIVEN the status of a kernel thread, which has no VmRSS line
    with pytest.raises(ValueError, match="VmRSS"):
        parse_vm_rss_kib("Name:\tkthreadd\nState:\tS (sleeping)\n")


def test_cpu_of_a_busy_child_agrees_with_its_own_count_and_its_ticks() -> None:
    # GIVEN a child that burns CPU, prints what it used, then waits to be read
    code = (
        "import sys, time\n"
        "end = time.process_time() + 0.3\n"
        "while time.process_time() < end: pass\n"
        "print(time.process_time(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        own = float(child.stdout.readline())
        # WHEN the benchmark reads the child's CPU time and memory
        reading = cpu(child.pid)
        memory = rss_mb(child.pid)
    finally:
        child.communicate("")
    # THEN the precise reading is what the child counted (plus its start-up), and the ticks agree within a tick
    assert own <= reading.seconds < own + 0.5
    assert abs(reading.ticks / CLOCK_TICKS - reading.seconds) <= 2 / CLOCK_TICKS
    assert 1 < memory < 500


def test_a_process_that_is_gone_says_so() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    time.sleep(0.05)
    with pytest.raises(ProcessGoneError):
        cpu(child.pid)


def test_command_name_keeps_its_own_parentheses() -> None:
    assert parse_stat_comm(STAT) == "my (odd) name"
    with pytest.raises(ValueError, match="command name"):
        parse_stat_comm("4242 S 1")


def test_schedstat_time_is_nanoseconds() -> None:
    assert parse_schedstat_seconds("187286313 347901 7\n") == pytest.approx(0.187286313)
    with pytest.raises(ValueError, match="schedstat"):
        parse_schedstat_seconds("")


def test_thread_shares_name_python_threads_by_start_order_and_native_threads_by_their_name() -> None:
    # GIVEN an agent: main thread 100, Python threads 101-104 started in order, a gRPC thread, one more thread
    before = {
        100: ThreadCpu("mbridge", 1.0),
        101: ThreadCpu("mbridge", 0.1),
        102: ThreadCpu("mbridge", 0.2),
        103: ThreadCpu("mbridge", 0.3),
        104: ThreadCpu("mbridge", 0.4),
        110: ThreadCpu("event_engine", 0.5),
    }
    after = {
        100: ThreadCpu("mbridge", 1.5),
        101: ThreadCpu("mbridge", 0.1),
        102: ThreadCpu("mbridge", 0.3),
        103: ThreadCpu("mbridge", 1.3),
        104: ThreadCpu("mbridge", 0.6),
        110: ThreadCpu("event_engine", 0.75),
        111: ThreadCpu("event_engine", 0.25),
        120: ThreadCpu("mbridge", 0.05),  # started during the window
    }
    # WHEN the CPU time in between is shared out
    shares = thread_shares(100, before, after, ("health", "publisher", "watcher", "commands"))
    # THEN each role gets its own thread's difference, and same-named native threads are added up
    assert shares == pytest.approx(
        {
            "main": 0.5,
            "health": 0.0,
            "publisher": 0.1,
            "watcher": 1.0,
            "commands": 0.2,
            "event_engine": 0.5,
            "other": 0.05,
        }
    )


def test_thread_cpu_of_this_process_lists_this_thread() -> None:
    threads = thread_cpu(os.getpid())
    assert threading.get_native_id() in threads
    assert all(thread.seconds >= 0 for thread in threads.values())
