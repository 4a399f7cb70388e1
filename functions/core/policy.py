"""The declarative policy of the functions (docs/policy.md), read from JSON or YAML.

Every number of the default policy is a setting here; docs/policy.md documents each one.
A policy is validated once, when the function app starts: a wrong key or value stops it
with a message naming the key, instead of acting on a half-understood policy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from wire.errors import PermanentError
from wire.model import DEFAULT_HARMLESS_FREEZE_SECONDS

# Who a report may speak for (docs/security.md): `attested`, the VM its cloud-signed proof names;
# `reporter-name`, the VM it names itself — only for VMs without a metadata identity (unsafe).
TRUST_ATTESTED = "attested"
TRUST_REPORTER_NAME = "reporter-name"
TRUST_MODES = (TRUST_ATTESTED, TRUST_REPORTER_NAME)
SILENT_AGENT_ACTIONS = ("audit", "drain")


class PolicyError(PermanentError):
    """The policy document is invalid; the message names the key and what it accepts."""


@dataclass(frozen=True)
class Pool:
    """VMs that share a disruption budget (e.g. the members of one load-balancer backend)."""

    name: str
    vms: frozenset[str]
    max_drained: int | None  # None: unlimited


@dataclass(frozen=True)
class Policy:
    # Rule 3: a Freeze this short (and not unknown) is harmless: approve at once, no drain.
    harmless_freeze_seconds: int = DEFAULT_HARMLESS_FREEZE_SECONDS
    # Rule 4: user-initiated events (restart, redeploy from the portal/API) are approved at once.
    approve_user_events: bool = True
    # Rule 5: other Azure events are approved after the drain period, never later than
    # NotBefore minus the margin (so the approval is not moot).
    approve_platform_events: bool = True
    drain_period_seconds: float = 30.0
    not_before_margin_seconds: float = 5.0
    # A drain through the agent's /readyz is done for the load balancer only once its probe has seen
    # the VM unready: probe interval x unhealthy threshold (docs/policy.md#probe-aware-drains). The
    # drain period starts then. Used when the app cannot read the probe itself. 30 s covers Azure Load
    # Balancer's default probe (15 s, 2 probes) and a Cloud Load Balancing health check's (5 s, 2 checks).
    readiness_probe_seconds: float = 30.0
    # Approvals travel as commands that expire after this long.
    command_ttl_seconds: float = 600.0
    # Disruption budget: pools and how many of their VMs may be drained at once. A VM in no
    # pool is in the default pool, whose budget is `default_max_drained` (None: unlimited).
    pools: tuple[Pool, ...] = ()
    default_max_drained: int | None = None
    # GCE upcoming-maintenance: "audit" (default) or "perform_maintenance" when the notice can
    # be rescheduled and now is inside the window below (UTC hours, start inclusive).
    gce_upcoming_action: str = "audit"
    maintenance_window_utc: tuple[int, int] | None = None
    # Decide and audit, but change nothing (no drain, no approval, no restore).
    dry_run: bool = False
    # Whose word a report is: see TRUST_MODES.
    trust: str = TRUST_ATTESTED
    # An event the control plane reported whose VM's agent did not within `silent_agent_seconds`:
    # "audit" (default: audited `agent-silent`, alerted, notified) or "drain" (also take the VM out
    # of its pools on the control plane's word; never approved from there).
    silent_agents: str = "audit"
    silent_agent_seconds: float = 60.0

    def pool_of(self, vm: str) -> Pool:
        for pool in self.pools:
            if vm in pool.vms:
                return pool
        return Pool(name="default", vms=frozenset(), max_drained=self.default_max_drained)

    def in_maintenance_window(self, hour_utc: int) -> bool:
        if self.maintenance_window_utc is None:
            return False
        start, end = self.maintenance_window_utc
        return start <= hour_utc < end if start <= end else hour_utc >= start or hour_utc < end


DEFAULT_POLICY = Policy()

_SCALARS: dict[str, tuple[type, ...]] = {
    "harmless_freeze_seconds": (int,),
    "approve_user_events": (bool,),
    "approve_platform_events": (bool,),
    "drain_period_seconds": (int, float),
    "not_before_margin_seconds": (int, float),
    "readiness_probe_seconds": (int, float),
    "command_ttl_seconds": (int, float),
    "default_max_drained": (int, type(None)),
    "gce_upcoming_action": (str,),
    "dry_run": (bool,),
    "trust": (str,),
    "silent_agents": (str,),
    "silent_agent_seconds": (int, float),
}


def load_policy(text: str | bytes | None, source: str | None = None) -> Policy:
    """Parse a policy document (JSON, or YAML when PyYAML is installed); empty → the default.

    `source`, a file name, decides the format by its suffix (.json, .yaml, .yml); without one, text
    that starts like JSON is reported as JSON when it parses as neither.

    Raises:
        PolicyError: naming the key that is wrong, or where the document stops parsing.
    """
    if text is None or not str(text if isinstance(text, str) else text.decode()).strip():
        return DEFAULT_POLICY
    document = _parse(text, source)
    if not isinstance(document, dict):
        raise PolicyError("a policy is a JSON/YAML object of settings; see docs/policy.md")
    return policy_from_mapping(document)


def policy_from_mapping(document: Mapping[str, Any]) -> Policy:
    known = {f.name for f in fields(Policy)}
    unknown = sorted(set(document) - known)
    if unknown:
        raise PolicyError(f"unknown policy setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for name, kinds in _SCALARS.items():
        if name not in document:
            continue
        value = document[name]
        if isinstance(value, bool) and bool not in kinds:
            raise PolicyError(f"policy setting {name!r} must be a number, not a boolean")
        if not isinstance(value, kinds):
            raise PolicyError(f"policy setting {name!r} has the wrong type: {value!r}")
        values[name] = value
    for name in (
        "harmless_freeze_seconds",
        "drain_period_seconds",
        "not_before_margin_seconds",
        "readiness_probe_seconds",
        "command_ttl_seconds",
        "silent_agent_seconds",
    ):
        if name in values and not math.isfinite(values[name]):
            raise PolicyError(f"policy setting {name!r} must be a finite number")
        if name in values and values[name] < 0:
            raise PolicyError(f"policy setting {name!r} must be >= 0")
    if values.get("command_ttl_seconds", 1) <= 0:
        raise PolicyError("policy setting 'command_ttl_seconds' must be > 0")
    drain = values.get("drain_period_seconds", Policy.drain_period_seconds)
    probe = values.get("readiness_probe_seconds", Policy.readiness_probe_seconds)
    if drain + probe >= values.get("command_ttl_seconds", Policy.command_ttl_seconds):
        raise PolicyError(
            "policy settings 'drain_period_seconds' and 'readiness_probe_seconds' together must be shorter than "
            "'command_ttl_seconds': an approval held for them would expire before it is executed"
        )
    if values.get("default_max_drained") is not None and values["default_max_drained"] < 1:
        raise PolicyError("policy setting 'default_max_drained' must be >= 1, or null for unlimited")
    if values.get("silent_agents", "audit") not in SILENT_AGENT_ACTIONS:
        raise PolicyError(
            "policy setting 'silent_agents' is 'audit' (say so: audit, alert, notify) or 'drain' (also take the VM "
            "out of its pools on the control plane's word; it is never approved from there)"
        )
    if values.get("gce_upcoming_action", "audit") not in ("audit", "perform_maintenance"):
        raise PolicyError("policy setting 'gce_upcoming_action' is 'audit' or 'perform_maintenance'")
    if values.get("trust", TRUST_ATTESTED) not in TRUST_MODES:
        raise PolicyError(
            "policy setting 'trust' is 'attested' (act on a report only for the VM its cloud-signed proof names) "
            "or 'reporter-name' (take the reporter's word: only for VMs without a metadata identity, unsafe)"
        )
    if "pools" in document:
        values["pools"] = _pools(document["pools"])
    if "maintenance_window_utc" in document:
        values["maintenance_window_utc"] = _window(document["maintenance_window_utc"])
    return Policy(**values)


def policy_document(policy: Policy) -> dict[str, Any]:
    """The policy as a document `policy_from_mapping` reads back to it: every setting, for a run that
    writes down the policy it ran with (the demo's, for `mbridge replay`)."""
    document: dict[str, Any] = {name: getattr(policy, name) for name in _SCALARS}
    document["pools"] = {pool.name: {"vms": sorted(pool.vms), "max_drained": pool.max_drained} for pool in policy.pools}
    window = policy.maintenance_window_utc
    document["maintenance_window_utc"] = None if window is None else list(window)
    return document


def _pools(raw: Any) -> tuple[Pool, ...]:
    if not isinstance(raw, dict):
        raise PolicyError('policy setting \'pools\' is an object: {"web": {"vms": [...], "max_drained": 1}}')
    pools = []
    seen: dict[str, str] = {}
    for name, spec in raw.items():
        if name == "default":
            raise PolicyError("pool name 'default' is reserved for VMs in no pool (see 'default_max_drained')")
        if name.startswith("~"):
            raise PolicyError(
                f"pool name {name[:60]!r}: names starting with '~' are reserved for the functions' own lines"
            )
        if not isinstance(spec, dict) or set(spec) - {"vms", "max_drained"}:
            raise PolicyError(f"pool {name!r} takes 'vms' (list of VM names) and 'max_drained' (>= 1 or null)")
        vms = spec.get("vms", [])
        if not isinstance(vms, list) or not all(isinstance(vm, str) and vm for vm in vms):
            raise PolicyError(f"pool {name!r}: 'vms' must be a list of VM names")
        limit = spec.get("max_drained")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise PolicyError(f"pool {name!r}: 'max_drained' must be an integer >= 1, or null for unlimited")
        for vm in vms:
            if vm in seen:
                raise PolicyError(f"VM {vm!r} is in two pools ({seen[vm]!r} and {name!r}); a VM has one budget")
            seen[vm] = name
        pools.append(Pool(name=name, vms=frozenset(vms), max_drained=limit))
    return tuple(pools)


def _window(raw: Any) -> tuple[int, int] | None:
    if raw is None:
        return None
    valid = (
        isinstance(raw, list)
        and len(raw) == 2
        and all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h <= 23 for h in raw)
    )
    if not valid:
        raise PolicyError("policy setting 'maintenance_window_utc' is [start_hour, end_hour] in UTC, 0-23")
    return (raw[0], raw[1])


def _parse(text: str | bytes, source: str | None = None) -> Any:
    what = f"the policy {source}" if source else "the policy"
    suffix = source.rsplit(".", 1)[-1].lower() if source and "." in source else ""
    as_text = text if isinstance(text, str) else text.decode("utf-8", errors="replace")
    # Text that starts like JSON and parses as neither was meant as JSON (a truncated file, say):
    # report JSON's error and position, not YAML's.
    looks_like_json = suffix == "json" or (not suffix and as_text.lstrip()[:1] in ("{", "["))
    if suffix not in ("yaml", "yml"):
        try:
            return json.loads(text)
        except ValueError as json_error:
            if suffix == "json":
                raise PolicyError(f"{what} is not valid JSON: {json_error}") from None
            if looks_like_json:
                try:
                    return _parse_yaml(text, what)
                except PolicyError:
                    raise PolicyError(f"{what} is not valid JSON: {json_error}") from None
            return _parse_yaml(text, what, json_error)
    return _parse_yaml(text, what)


def _parse_yaml(text: str | bytes, what: str, json_error: ValueError | None = None) -> Any:
    try:
        import yaml
    except ImportError:
        if json_error is not None:
            raise PolicyError(f"{what} is not JSON ({json_error}); for YAML install PyYAML") from None
        raise PolicyError(f"{what} is YAML: install PyYAML to read it") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        kind = "neither JSON nor YAML" if json_error is not None else "not valid YAML"
        raise PolicyError(f"{what} is {kind}: {exc}") from exc
