"""Flags of `mbridge replay` and the trust it replays with; the replay itself is
functions.local_app.replay.

A report counts only for the VM its proof names, as in the functions: replay checks the recorded
proofs with the functions' own trust settings — the trust file of the local functions and the demo,
or a function app's settings — and takes reporters at their word only when told to
(--trust-reporter-name) or when the policy's trust is `reporter-name`. With none of these it
refuses to guess: a replay that trusts every name tells a story the functions never told.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from functions.core.policy import Policy, PolicyError, load_policy
from functions.local_app.replay import NOTHING_REPLAYED, Trust, policys_own, replay, reporter_names, trust_file
from functions.trust.trust_file import TrustFileError
from wire.errors import BridgeError

TRUST_FILE = "MBRIDGE_TRUST_FILE"
CLOUD_SETTINGS = ("azure", "gcp")


class ReplaySetupError(Exception):
    """A setting replay cannot go on with; the message names it."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--events",
        required=True,
        help="JSON lines: the inputs the functions recorded (the demo's recorded.jsonl), or envelopes (the agent's "
        "jsonl output); - for stdin",
    )
    parser.add_argument("--policy", help="policy file (JSON or YAML); default: the default policy of docs/policy.md")
    trust = parser.add_argument_group(
        "trust",
        "whose word a report is, as in the functions (docs/security.md): one of these, or policy trust: reporter-name",
    )
    choice = trust.add_mutually_exclusive_group()
    choice.add_argument(
        "--trust-file",
        default=os.environ.get(TRUST_FILE) or None,
        help=f"check each proof with this trust file, as the local functions and the demo do [{TRUST_FILE}]",
    )
    choice.add_argument(
        "--trust-settings",
        choices=CLOUD_SETTINGS,
        help="check each proof with a function app's trust settings, read from the MBRIDGE_* variables as the app "
        "reads them (azure: MBRIDGE_TRUST_SUBSCRIPTIONS, ..., on your Azure credentials; gcp: MBRIDGE_GCP_PROJECT, "
        "MBRIDGE_TRUST_PROJECTS, ...)",
    )
    choice.add_argument(
        "--trust-reporter-name",
        action="store_true",
        help="check no proof: take each report at its reporter's word (recordings without proofs, a policy "
        "rehearsal); a forged report then counts as genuine",
    )


def run(args: argparse.Namespace) -> int:
    # The lines replay prints say what the functions' log said; that log's own lines (a refused report, an
    # agent found silent) would read as alerts of the present.
    functions_log = logging.getLogger("mbridge.functions")
    if not any(isinstance(handler, logging.NullHandler) for handler in functions_log.handlers):
        functions_log.addHandler(logging.NullHandler())
    try:
        policy = _policy(args.policy)
        trust = build_trust(args, policy)
    except ReplaySetupError as exc:
        print(f"mbridge replay: {exc}", file=sys.stderr)
        return 2
    source = "standard input" if args.events == "-" else args.events
    try:
        if args.events == "-":
            status = replay(sys.stdin, policy, trust, sys.stdout, sys.stderr)
        else:
            with open(args.events, encoding="utf-8") as events:
                status = replay(events, policy, trust, sys.stdout, sys.stderr)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"mbridge replay: cannot read the events file {source}: {_reason(exc)}", file=sys.stderr)
        return 2
    if status == NOTHING_REPLAYED:
        print(
            f"mbridge replay: no line of {source} is an envelope or a recorded input; give what the functions "
            "recorded (the demo's recorded.jsonl) or the agent's jsonl output (--transport jsonl)",
            file=sys.stderr,
        )
    return status


def _policy(path: str | None) -> Policy:
    try:
        text = Path(path).read_text(encoding="utf-8") if path else None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplaySetupError(f"cannot read the policy file {path}: {_reason(exc)}") from exc
    try:
        return load_policy(text, path)
    except PolicyError as exc:
        raise ReplaySetupError(str(exc)) from exc


def build_trust(args: argparse.Namespace, policy: Policy) -> Trust:
    """The trust the functions would have: the policy's own when it says reporter-name (the apps then
    read no trust setting), else the one asked for."""
    own = policys_own(policy)
    if own is not None:
        return own
    if args.trust_reporter_name:
        return reporter_names()
    if args.trust_settings:
        return _cloud_settings(args.trust_settings)
    if args.trust_file:
        try:
            return trust_file(args.trust_file)
        except TrustFileError as exc:
            raise ReplaySetupError(str(exc)) from exc
    raise ReplaySetupError(
        "say whose word a report is, as the functions check it: --trust-file FILE (the trust file the local "
        f"functions use, {TRUST_FILE}), --trust-settings azure|gcp (a function app's trust settings), or "
        "--trust-reporter-name (check no proof: a forged report counts as genuine)"
    )


def _cloud_settings(cloud: str) -> Trust:
    """The verifier a function app builds from its trust settings, from the same variables."""
    try:
        if cloud == "azure":
            return _azure()
        return _gcp()
    except BridgeError as exc:  # each app's SettingsError, naming the variable
        raise ReplaySetupError(f"--trust-settings {cloud}: {exc}") from exc


def _azure() -> Trust:
    from azure.identity import DefaultAzureCredential

    from functions.azure_app.settings import attested_trust
    from functions.azure_app.wiring import attested_verifier

    verifier = attested_verifier(attested_trust(os.environ), DefaultAzureCredential())
    return Trust(
        verifier,
        "proofs checked with the Azure function app's trust settings (MBRIDGE_TRUST_*); each VM is looked up now, "
        "with your credentials",
    )


def _gcp() -> Trust:
    from functions.gcp_app.settings import Settings
    from functions.gcp_app.wiring import build_verifier

    settings = Settings.from_env()
    verifier = build_verifier(settings)
    if verifier is None:
        raise ReplaySetupError(
            "--trust-settings gcp: MBRIDGE_POLICY's trust is reporter-name, so the GCP app checks no proof; "
            "give that policy with --policy, or --trust-reporter-name"
        )
    where = f"the trust file {settings.trust_file}" if settings.trust_file else "Google's certificates fetched now"
    return Trust(verifier, f"proofs checked with the GCP function app's trust settings (MBRIDGE_TRUST_*), with {where}")


def _reason(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
