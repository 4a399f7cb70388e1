"""A trace id given on the command line (`mbridge audit list --trace`, `mbridge approve --trace`):
32 lowercase hex digits, not all zeros, as wire/tracecontext.py writes it and the audit log shows it."""

from __future__ import annotations

import argparse

from wire.tracecontext import is_trace_id


def trace_id(value: str) -> str:
    """argparse's `type` of a trace-id flag: a value that is not one is a usage error (exit 2)."""
    if not is_trace_id(value):
        raise argparse.ArgumentTypeError(
            f"{value[:80]!r} is not a trace id: 32 lowercase hex digits, not all zeros "
            "(the trace_id of an audit record or a log line)"
        )
    return value
