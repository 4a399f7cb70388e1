"""The policy document (docs/policy.md#settings): loading JSON/YAML, validation, pools and the window.

A wrong policy must stop the function app at start with a message that names the key, so
every validation error below is checked for the key it names.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from functions.core.policy import DEFAULT_POLICY, Policy, PolicyError, Pool, load_policy, policy_document
from wire.errors import PermanentError

FULL_JSON = """
{
  "harmless_freeze_seconds": 5,
  "approve_user_events": false,
  "approve_platform_events": true,
  "drain_period_seconds": 45.5,
  "not_before_margin_seconds": 10,
  "command_ttl_seconds": 900,
  "pools": {
    "web": {"vms": ["web-0", "web-1", "web-2"], "max_drained": 1},
    "batch": {"vms": ["batch-0"]}
  },
  "default_max_drained": 2,
  "gce_upcoming_action": "perform_maintenance",
  "maintenance_window_utc": [22, 4],
  "dry_run": true
}
"""

FULL_YAML = textwrap.dedent(
    """\
    # the same policy as FULL_JSON
    harmless_freeze_seconds: 5
    approve_user_events: false
    approve_platform_events: true
    drain_period_seconds: 45.5
    not_before_margin_seconds: 10
    command_ttl_seconds: 900
    pools:
      web:
        vms: [web-0, web-1, web-2]
        max_drained: 1
      batch:
        vms:
          - batch-0
    default_max_drained: 2
    gce_upcoming_action: perform_maintenance
    maintenance_window_utc: [22, 4]
    dry_run: true
    """
)

FULL_POLICY = Policy(
    harmless_freeze_seconds=5,
    approve_user_events=False,
    approve_platform_events=True,
    drain_period_seconds=45.5,
    not_before_margin_seconds=10,
    command_ttl_seconds=900,
    pools=(
        Pool("web", frozenset({"web-0", "web-1", "web-2"}), max_drained=1),
        Pool("batch", frozenset({"batch-0"}), max_drained=None),
    ),
    default_max_drained=2,
    gce_upcoming_action="perform_maintenance",
    maintenance_window_utc=(22, 4),
    dry_run=True,
)


def test_defaults_are_the_documented_default_policy() -> None:
    # GIVEN the policy with no settings
    policy = Policy()

    # THEN every setting has the default that docs/policy.md documents
    assert policy == DEFAULT_POLICY
    assert policy.harmless_freeze_seconds == 10
    assert policy.approve_user_events is True
    assert policy.approve_platform_events is True
    assert policy.drain_period_seconds == 30
    assert policy.not_before_margin_seconds == 5
    assert policy.command_ttl_seconds == 600
    assert policy.pools == ()
    assert policy.default_max_drained is None
    assert policy.gce_upcoming_action == "audit"
    assert policy.maintenance_window_utc is None
    assert policy.dry_run is False


@pytest.mark.parametrize(
    "text", [None, "", "   \n\t", b"", b"  \n"], ids=["none", "empty", "blank", "bytes", "blank-bytes"]
)
def test_empty_policy_is_the_default(text: str | bytes | None) -> None:
    # GIVEN an app setting that is unset or blank
    # WHEN it is loaded
    policy = load_policy(text)

    # THEN the default policy applies
    assert policy is DEFAULT_POLICY


@pytest.mark.parametrize(
    "text", [FULL_JSON, FULL_JSON.encode(), FULL_YAML, FULL_YAML.encode()], ids=["json", "json-b", "yaml", "yaml-b"]
)
def test_full_document_in_json_or_yaml(text: str | bytes) -> None:
    # GIVEN a policy that sets every setting, as JSON or YAML text or bytes
    # WHEN it is loaded
    policy = load_policy(text)

    # THEN every setting is read, and JSON and YAML give the same policy
    assert policy == FULL_POLICY


def test_partial_document_keeps_the_other_defaults() -> None:
    # GIVEN a policy that only turns on dry run and lengthens the drain period
    # WHEN it is loaded
    policy = load_policy('{"dry_run": true, "drain_period_seconds": 60}')

    # THEN those two change and nothing else does
    assert policy == Policy(dry_run=True, drain_period_seconds=60)


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"default_max_drained": None}, Policy(default_max_drained=None)),
        ({"maintenance_window_utc": None}, Policy(maintenance_window_utc=None)),
        ({"maintenance_window_utc": [0, 23]}, Policy(maintenance_window_utc=(0, 23))),
        ({"pools": {}}, Policy(pools=())),
        ({"pools": {"web": {}}}, Policy(pools=(Pool("web", frozenset(), None),))),
        ({"pools": {"web": {"vms": ["a"], "max_drained": None}}}, Policy(pools=(Pool("web", frozenset({"a"}), None),))),
        ({"harmless_freeze_seconds": 0, "drain_period_seconds": 0, "not_before_margin_seconds": 0}, None),
        (
            {"command_ttl_seconds": 0.5, "drain_period_seconds": 0, "readiness_probe_seconds": 0},
            Policy(command_ttl_seconds=0.5, drain_period_seconds=0, readiness_probe_seconds=0),
        ),
        ({"gce_upcoming_action": "audit"}, Policy(gce_upcoming_action="audit")),
    ],
    ids=["unlimited", "no-window", "window-0-23", "no-pools", "empty-pool", "pool-unlimited", "zeros", "ttl", "audit"],
)
def test_edge_values_that_are_valid(document: dict[str, Any], expected: Policy | None) -> None:
    # GIVEN a policy with values at the edge of what is accepted
    # WHEN it is loaded
    policy = load_policy(json.dumps(document))

    # THEN it is accepted as written
    assert policy == (expected if expected is not None else Policy(**document))


def test_policy_error_is_permanent() -> None:
    # GIVEN an invalid policy
    # WHEN it is loaded
    with pytest.raises(PolicyError) as raised:
        load_policy('{"dry_run": "yes"}')

    # THEN the error is permanent: retrying the same settings cannot help
    assert isinstance(raised.value, PermanentError)


@pytest.mark.parametrize(
    ("document", "names"),
    [
        # unknown keys (a typo must not silently fall back to a default)
        ({"drain_period": 30}, "'drain_period'"),
        ({"dry_run": True, "dryrun": True}, "'dryrun'"),
        ({"pool": {}}, "'pool'"),
        # wrong types
        ({"harmless_freeze_seconds": "10"}, "'harmless_freeze_seconds'"),
        ({"harmless_freeze_seconds": 5.5}, "'harmless_freeze_seconds'"),
        ({"approve_user_events": "true"}, "'approve_user_events'"),
        ({"approve_user_events": 1}, "'approve_user_events'"),
        ({"approve_platform_events": None}, "'approve_platform_events'"),
        ({"approve_platform_events": 0}, "'approve_platform_events'"),
        ({"drain_period_seconds": "30"}, "'drain_period_seconds'"),
        ({"drain_period_seconds": None}, "'drain_period_seconds'"),
        ({"not_before_margin_seconds": [5]}, "'not_before_margin_seconds'"),
        ({"command_ttl_seconds": "600"}, "'command_ttl_seconds'"),
        ({"default_max_drained": "2"}, "'default_max_drained'"),
        ({"default_max_drained": 1.5}, "'default_max_drained'"),
        ({"gce_upcoming_action": 1}, "'gce_upcoming_action'"),
        ({"gce_upcoming_action": None}, "'gce_upcoming_action'"),
        ({"dry_run": "true"}, "'dry_run'"),
        ({"dry_run": 1}, "'dry_run'"),
        # booleans where numbers are expected
        ({"harmless_freeze_seconds": True}, "'harmless_freeze_seconds'"),
        ({"drain_period_seconds": True}, "'drain_period_seconds'"),
        ({"not_before_margin_seconds": False}, "'not_before_margin_seconds'"),
        ({"command_ttl_seconds": True}, "'command_ttl_seconds'"),
        ({"default_max_drained": True}, "'default_max_drained'"),
        # negative numbers, and limits below their minimum
        ({"harmless_freeze_seconds": -1}, "'harmless_freeze_seconds'"),
        ({"drain_period_seconds": -0.5}, "'drain_period_seconds'"),
        ({"not_before_margin_seconds": -5}, "'not_before_margin_seconds'"),
        ({"readiness_probe_seconds": -1}, "'readiness_probe_seconds'"),
        # the approval must outlive the probe and the drain period
        ({"command_ttl_seconds": 60, "drain_period_seconds": 30, "readiness_probe_seconds": 30}, "readiness_probe"),
        ({"command_ttl_seconds": 0}, "'command_ttl_seconds'"),
        ({"command_ttl_seconds": -600}, "'command_ttl_seconds'"),
        ({"default_max_drained": 0}, "'default_max_drained'"),
        ({"default_max_drained": -1}, "'default_max_drained'"),
        # gce_upcoming_action values
        ({"gce_upcoming_action": "perform"}, "'gce_upcoming_action'"),
        ({"gce_upcoming_action": "PERFORM_MAINTENANCE"}, "'gce_upcoming_action'"),
        ({"gce_upcoming_action": ""}, "'gce_upcoming_action'"),
        # maintenance window shape
        ({"maintenance_window_utc": [1]}, "'maintenance_window_utc'"),
        ({"maintenance_window_utc": [1, 2, 3]}, "'maintenance_window_utc'"),
        ({"maintenance_window_utc": []}, "'maintenance_window_utc'"),
        ({"maintenance_window_utc": "22-4"}, "'maintenance_window_utc'"),
        ({"maintenance_window_utc": {"start": 22, "end": 4}}, "'maintenance_window_utc'"),
        ({"maintenance_window_utc": [22, 24]}, "'maintenance_window_utc'"),
        ({"maintenance_window_utc": [-1, 4]}, "'maintenance_window_utc'"),
        ({"maintenance_window_utc": [1.5, 4]}, "'maintenance_window_utc'"),
        ({"maintenance_window_utc": ["22", "4"]}, "'maintenance_window_utc'"),
        ({"maintenance_window_utc": 22}, "'maintenance_window_utc'"),
        # pools shape
        ({"pools": [{"vms": ["a"]}]}, "'pools'"),
        ({"pools": None}, "'pools'"),
        ({"pools": "web"}, "'pools'"),
        ({"pools": {"web": ["a", "b"]}}, "pool 'web'"),
        ({"pools": {"web": None}}, "pool 'web'"),
        ({"pools": {"web": {"vms": ["a"], "limit": 1}}}, "pool 'web'"),
        ({"pools": {"web": {"vms": "a"}}}, "pool 'web': 'vms'"),
        ({"pools": {"web": {"vms": ["a", 1]}}}, "pool 'web': 'vms'"),
        ({"pools": {"web": {"vms": ["a", ""]}}}, "pool 'web': 'vms'"),
        ({"pools": {"web": {"vms": None}}}, "pool 'web': 'vms'"),
        ({"pools": {"web": {"vms": ["a"], "max_drained": 0}}}, "pool 'web': 'max_drained'"),
        ({"pools": {"web": {"vms": ["a"], "max_drained": -2}}}, "pool 'web': 'max_drained'"),
        ({"pools": {"web": {"vms": ["a"], "max_drained": "1"}}}, "pool 'web': 'max_drained'"),
        ({"pools": {"web": {"vms": ["a"], "max_drained": 1.0}}}, "pool 'web': 'max_drained'"),
        ({"pools": {"web": {"vms": ["a"], "max_drained": True}}}, "pool 'web': 'max_drained'"),
        # one VM, two budgets
        (
            {"pools": {"web": {"vms": ["a", "b"]}, "api": {"vms": ["c", "b"]}}},
            "VM 'b' is in two pools ('web' and 'api')",
        ),
    ],
)
def test_every_validation_error_names_its_key(document: dict[str, Any], names: str) -> None:
    # GIVEN a policy with one wrong setting (as JSON)
    text = json.dumps(document)

    # WHEN it is loaded
    # THEN it is refused with a message naming the setting (or pool and sub-key)
    with pytest.raises(PolicyError, match=re.escape(names)):
        load_policy(text)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("dry_run: yes please\n", "'dry_run'"),
        ("drain_period_seconds: 30s\n", "'drain_period_seconds'"),
        ("maintenance_window_utc: 22-4\n", "'maintenance_window_utc'"),
        ("pools:\n  web:\n    vms: a, b\n", "pool 'web': 'vms'"),
        ("approve_user_events: off\ntypo_setting: 1\n", "'typo_setting'"),
    ],
)
def test_yaml_validation_errors_name_their_key(text: str, names: str) -> None:
    # GIVEN a YAML policy with a mistake that YAML itself accepts
    # WHEN it is loaded
    # THEN the policy validation refuses it, naming the key
    with pytest.raises(PolicyError, match=re.escape(names)):
        load_policy(text)


@pytest.mark.parametrize(
    "text",
    ["[]", '["dry_run"]', "42", '"dry_run"', "null", "- dry_run: true\n", "just some words"],
)
def test_document_must_be_an_object(text: str) -> None:
    # GIVEN a policy document that parses but is not an object of settings
    # WHEN it is loaded
    # THEN it is refused, pointing to the reference
    with pytest.raises(PolicyError, match="object of settings"):
        load_policy(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # text that starts like JSON gets JSON's error, with its position, not YAML's
        ('{"dry_run": true', "is not valid JSON: Expecting ',' delimiter: line 1 column 17"),
        ("dry_run: [true\n", "neither JSON nor YAML"),
        ("a: b: c\n", "neither JSON nor YAML"),
    ],
)
def test_unreadable_document_is_refused(text: str, message: str) -> None:
    # GIVEN text that is neither valid JSON nor valid YAML
    # WHEN it is loaded
    # THEN it is refused as such
    with pytest.raises(PolicyError, match=re.escape(message)):
        load_policy(text)


def test_a_file_name_decides_the_format() -> None:
    # GIVEN YAML text in a file named .json, and JSON-looking text in a .yaml file
    with pytest.raises(PolicyError, match=r"the policy p\.json is not valid JSON"):
        load_policy("drain_period_seconds: 10\n", "p.json")
    assert load_policy('{"drain_period_seconds": 11}', "p.yaml").drain_period_seconds == 11
    with pytest.raises(PolicyError, match=r"the policy p\.yml is not valid YAML"):
        load_policy("a: b: c\n", "p.yml")


POLICY_DOC = Path(__file__).resolve().parents[3] / "docs" / "policy.md"


def _doc_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", POLICY_DOC.read_text(encoding="utf-8"), re.M | re.S)


def test_documented_example_is_valid_and_the_same_in_json_and_yaml() -> None:
    # GIVEN the complete example of docs/policy.md, in JSON and in YAML
    (json_text,) = _doc_blocks("json")
    (yaml_text,) = _doc_blocks("yaml")

    # WHEN both are loaded
    from_json = load_policy(json_text)
    from_yaml = load_policy(yaml_text)

    # THEN both are valid, set every setting away from its default, and are the same policy
    assert from_json == from_yaml
    changed = {f.name for f in fields(Policy) if getattr(from_json, f.name) != getattr(DEFAULT_POLICY, f.name)}
    assert changed == {f.name for f in fields(Policy)} - {"approve_platform_events", "dry_run", "trust"}


def test_every_setting_is_documented_with_its_default() -> None:
    # GIVEN the settings table of docs/policy.md
    rows = {
        match.group(1): match.group(2)
        for match in re.finditer(r"^\| `(\w+)` \|[^|]*\| ([^|]*) \|", POLICY_DOC.read_text(encoding="utf-8"), re.M)
    }

    # THEN every setting of Policy has a row, and the row shows its default
    for setting in fields(Policy):
        assert setting.name in rows, f"{setting.name} is missing from docs/policy.md"
        default = getattr(DEFAULT_POLICY, setting.name)
        shown = {None: "null", True: "true", False: "false", (): "{}"}.get(default)
        if shown is None:
            shown = json.dumps(default) if isinstance(default, str) else f"{default:g}"
        assert f"`{shown}`" in rows[setting.name], f"{setting.name}: default {shown} not in {rows[setting.name]!r}"


# --- pool_of ------------------------------------------------------------------------------------


def test_pool_of_a_vm_in_a_pool() -> None:
    # GIVEN two pools
    policy = load_policy(FULL_JSON)

    # WHEN the pool of their VMs is asked
    # THEN each VM is in its own pool, with that pool's budget
    assert policy.pool_of("web-1") == Pool("web", frozenset({"web-0", "web-1", "web-2"}), max_drained=1)
    assert policy.pool_of("batch-0") == Pool("batch", frozenset({"batch-0"}), max_drained=None)


@pytest.mark.parametrize(("default_max_drained", "expected"), [(None, None), (3, 3)])
def test_pool_of_a_vm_in_no_pool_is_the_default_pool(default_max_drained: int | None, expected: int | None) -> None:
    # GIVEN a pool "web" and a default budget
    policy = Policy(pools=(Pool("web", frozenset({"web-0"}), 1),), default_max_drained=default_max_drained)

    # WHEN the pool of a VM in no pool is asked (names match exactly)
    pools = [policy.pool_of("db-0"), policy.pool_of("WEB-0")]

    # THEN it is the default pool, whose budget is default_max_drained
    assert pools == [Pool("default", frozenset(), expected)] * 2


def test_pool_of_with_no_pools_at_all() -> None:
    # GIVEN the default policy
    # WHEN the pool of any VM is asked
    pool = DEFAULT_POLICY.pool_of("anything")

    # THEN it is the unlimited default pool
    assert pool == Pool("default", frozenset(), None)


# --- in_maintenance_window -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "inside"),
    [
        (None, set()),
        ((2, 5), {2, 3, 4}),
        ((0, 23), set(range(23))),
        ((22, 4), {22, 23, 0, 1, 2, 3}),
        ((23, 0), {23}),
        ((0, 1), {0}),
        ((5, 5), set()),
    ],
    ids=["none", "2-5", "0-23", "wraps-midnight", "last-hour", "first-hour", "empty"],
)
def test_in_maintenance_window(window: tuple[int, int] | None, inside: set[int]) -> None:
    # GIVEN a maintenance window [start, end) in UTC hours
    policy = Policy(maintenance_window_utc=window)

    # WHEN every hour of the day is checked
    hours = {hour for hour in range(24) if policy.in_maintenance_window(hour)}

    # THEN exactly the hours from start (inclusive) to end (exclusive) are inside, across midnight too
    assert hours == inside


def test_loaded_window_wrapping_midnight() -> None:
    # GIVEN the window [22, 4] read from YAML
    policy = load_policy(FULL_YAML)

    # WHEN hours around both ends are checked
    # THEN 22:00-03:59 is inside and 04:00-21:59 is not
    assert [policy.in_maintenance_window(hour) for hour in (21, 22, 23, 0, 3, 4)] == [
        False,
        True,
        True,
        True,
        True,
        False,
    ]


# --- validation of values that pass the type check -------------------------------------------------


@pytest.mark.parametrize("window", [[True, 5], [22, False]], ids=["true-start", "false-end"])
def test_booleans_in_the_maintenance_window_are_refused(window: list[Any]) -> None:
    # GIVEN a maintenance window with a boolean instead of an hour
    # WHEN it is loaded
    # THEN it is refused, naming the key
    with pytest.raises(PolicyError, match="'maintenance_window_utc'"):
        load_policy(json.dumps({"maintenance_window_utc": window}))


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"drain_period_seconds": NaN}', "drain_period_seconds"),
        ('{"drain_period_seconds": Infinity}', "drain_period_seconds"),
        ("not_before_margin_seconds: .nan\n", "not_before_margin_seconds"),
        ("command_ttl_seconds: .inf\n", "command_ttl_seconds"),
    ],
    ids=["json-nan", "json-infinity", "yaml-nan", "yaml-inf"],
)
def test_numbers_that_are_not_finite_are_refused(text: str, key: str) -> None:
    # GIVEN a policy with a number that is not finite
    # WHEN it is loaded
    # THEN it is refused, naming the key
    with pytest.raises(PolicyError, match=f"'{key}'"):
        load_policy(text)


def test_drain_period_longer_than_the_command_ttl_is_refused() -> None:
    # GIVEN approvals that would be held 15 minutes but expire after 10
    # WHEN the policy is loaded
    # THEN it is refused, naming the drain period
    with pytest.raises(PolicyError, match="'drain_period_seconds'"):
        load_policy('{"drain_period_seconds": 900, "command_ttl_seconds": 600}')


@pytest.mark.parametrize(
    "policy",
    [
        DEFAULT_POLICY,
        # every setting away from its default
        replace(
            FULL_POLICY,
            approve_platform_events=False,
            readiness_probe_seconds=0,
            trust="reporter-name",
            silent_agents="drain",
            silent_agent_seconds=7.5,
        ),
    ],
    ids=["default", "every-setting"],
)
def test_a_policy_written_down_reads_back_as_the_same_policy(policy: Policy) -> None:
    # GIVEN a policy written down as a document (what the demo leaves for `mbridge replay`), as JSON
    text = json.dumps(policy_document(policy))
    # THEN it loads back to the very same policy, every setting included
    assert load_policy(text) == policy
    assert set(json.loads(text)) == {field.name for field in fields(Policy)}
