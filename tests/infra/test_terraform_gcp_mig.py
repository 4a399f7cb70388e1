"""The example managed instance group of the Google Cloud deployment (infra/terraform/gcp/mig_example.tf
and mig_health_checks.tf), read with python-hcl2 and evaluated by `terraform console`.

GIVEN the opt-in group: an instance template carrying the example VMs' agent, members made by name,
      an internal passthrough backend service, and two health checks
WHEN  Terraform evaluates the checks and the group's autohealing is read back through the functions'
      own reader and decision (functions/gcp_app/autohealer.py) from the Compute API's stand-in
THEN  the backend service probes the agent's /readyz and the group autoheals on another check, which
      the functions let a drain through; the other wiring is refused by the plan and by the functions
      alike; nothing is made unless asked for; every member has its commands subscription; an agent
      change replaces the members one at a time, keeping their names.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from functions.core.policy import Policy
from functions.gcp_app import autohealer
from functions.gcp_app.autohealer import HealthCheckTarget, MigAutohealers
from tests.contract.gcp.test_autohealer_reads import reader
from tests.contract.gcp.test_compute import BASE, PROJECT, ZONE_B, Fixture, compute
from tests.infra import console
from tests.infra.sources import REPO_ROOT, TERRAFORM_GCP
from tests.infra.test_terraform_gcp import (
    ACCOUNT_ID,
    block,
    default,
    local,
    of_type,
    ref,
    resource,
    resources,
    validation_rule,
)
from wire.shards import shard_of

__all__ = ["compute"]  # the Compute API stand-in's fixture

TEMPLATE = "google_compute_instance_template.mig"
CHECKS = "google_compute_health_check.mig"
GROUP = "google_compute_instance_group_manager.mig"
MEMBERS = "google_compute_per_instance_config.mig"
BACKEND = "google_compute_region_backend_service.mig"
SHARED_ACCOUNT = "google_service_account.mig_agent"
# What `terraform console` evaluates without a provider: the variables, the commands subscriptions
# and quotas, and the group's switch and checks.
CONSOLE_FILES = ("variables.tf", "commands_shards.tf", "mig_health_checks.tf")
MEMBER_NAMES = ["mbridge-mig-0", "mbridge-mig-1"]
# A Compute Engine resource name (instances, templates, health checks): 63 characters at most.
COMPUTE_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")


def console_module(directory: Path, replace: tuple[str, str] | None = None) -> Path:
    """The files of CONSOLE_FILES in `directory`, mig_health_checks.tf with one text replaced."""
    directory.mkdir(parents=True)
    for name in CONSOLE_FILES:
        shutil.copy(TERRAFORM_GCP / name, directory / name)
    if replace is not None:
        path = directory / "mig_health_checks.tf"
        text = path.read_text(encoding="utf-8")
        assert text.count(replace[0]) == 1, f"{replace[0]!r} is not written once in mig_health_checks.tf"
        path.write_text(text.replace(*replace), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return console_module(tmp_path_factory.mktemp("mig") / "gcp")


def evaluate(module: Path, expression: str, **variables: Any) -> Any:
    return console.evaluate(module, expression, {"project_id": PROJECT, **variables})


@dataclass(frozen=True)
class ExampleChecks:
    """The group's health checks as Terraform evaluates them, by key, and which serves what."""

    checks: dict[str, dict[str, Any]]
    backend: str
    autohealing: str
    conflicts: list[str]

    def target(self, key: str) -> HealthCheckTarget:
        """A check as the functions' reader makes it of an HTTP health check on a fixed port."""
        check = self.checks[key]
        return HealthCheckTarget(check["name"], "HTTP", check["request_path"], check["port"])


def example_checks(module: Path, **variables: Any) -> ExampleChecks:
    got = evaluate(
        module,
        "{checks = local.mig_health_checks, backend = local.mig_backend_check_key, "
        "autohealing = local.mig_autohealing_check_key, conflicts = local.mig_health_check_conflicts}",
        **variables,
    )
    return ExampleChecks(got["checks"], got["backend"], got["autohealing"], got["conflicts"])


def refuses_drains(check: HealthCheckTarget) -> bool:
    """Whether the functions refuse to drain a VM autohealed on `check` (autohealer.py's decision)."""
    return autohealer.conflicting([check], autohealer.READINESS_PATH, autohealer.AGENT_HEALTH_PORT) is not None


# ---------------------------------------------------------------- which check goes where


def test_the_backend_service_probes_one_check_and_the_group_autoheals_on_the_other() -> None:
    # GIVEN the group's autohealing policy and the backend service
    policy = block(resource(GROUP), "auto_healing_policies")
    backend = resource(BACKEND)
    # THEN each names its check by its own key, and the keys differ
    assert policy["health_check"] == ref(f"{CHECKS}[local.mig_autohealing_check_key].id")
    assert backend["health_checks"] == [ref(f"{CHECKS}[local.mig_backend_check_key].id")]
    assert local("mig_autohealing_check_key") != local("mig_backend_check_key")
    # AND the checks are made exactly as evaluated below (each.value is local.mig_health_checks')
    checks = resource(CHECKS)
    assert checks["for_each"] == "${local.mig_enabled ? local.mig_health_checks : {}}"
    for field in ("name", "check_interval_sec", "timeout_sec", "healthy_threshold", "unhealthy_threshold"):
        assert checks[field] == ref(f"each.value.{field}"), field
    assert block(checks, "http_health_check") == {
        "request_path": ref("each.value.request_path"),
        "port": ref("each.value.port"),
    }
    # AND the backend service balances the group's members, as an internal passthrough load balancer
    assert block(backend, "backend") == {
        "group": ref(f"{GROUP}[0].instance_group"),
        "balancing_mode": "CONNECTION",
    }
    assert (backend["load_balancing_scheme"], backend["protocol"]) == ("INTERNAL", "TCP")
    # AND a new member has time to boot and install the agent before autohealing judges it
    assert 120 <= policy["initial_delay_sec"] <= 900


@console.needs_terraform
def test_the_examples_checks_are_the_ones_the_docs_name(module: Path) -> None:
    # GIVEN the checks as Terraform evaluates them with the defaults
    example = example_checks(module)
    backend, autohealing = example.checks[example.backend], example.checks[example.autohealing]
    # THEN the backend service's is the agent's /readyz on its health port, autohealing's its /healthz
    port = autohealer.AGENT_HEALTH_PORT
    assert (backend["request_path"], backend["port"]) == (autohealer.READINESS_PATH, port)
    assert (autohealing["request_path"], autohealing["port"]) == ("/healthz", port)
    assert backend["name"] != autohealing["name"]
    assert all(COMPUTE_NAME.fullmatch(check["name"]) for check in example.checks.values())
    assert example.conflicts == []
    # AND that port is the one the example VMs' agents listen on and the firewall opens to the checks
    assert f'"MBRIDGE_LISTEN=0.0.0.0:{port}\\n"' in local("agent_environment")
    assert block(resource("google_compute_firewall.health_checks"), "allow")["ports"] == [str(port)]
    # AND a drained member is out of the backend within the policy's readiness_probe_seconds (with a
    # second or two for the command to reach the agent), from which the drain period is counted
    seen_unready = backend["check_interval_sec"] * backend["unhealthy_threshold"]
    assert seen_unready + 2 <= Policy().readiness_probe_seconds
    # AND autohealing gives up on a member later than the load balancer stops sending to it
    assert autohealing["check_interval_sec"] * autohealing["unhealthy_threshold"] > seen_unready


@console.needs_terraform
def test_the_docs_name_the_examples_checks(module: Path) -> None:
    # GIVEN docs/gcp.md's section on autohealers, and the checks as Terraform evaluates them
    section = (REPO_ROOT / "docs" / "gcp.md").read_text(encoding="utf-8").split("\n## Autohealers\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    example = example_checks(module)
    backend, autohealing = example.checks[example.backend], example.checks[example.autohealing]
    # THEN it points at the example and names each check where Terraform uses it
    assert "infra/terraform/gcp/mig_example.tf" in section
    rows = {row.split("|")[1].strip(): row for row in section.splitlines() if row.startswith("| `<mig_name>-")}

    def row_of(check: dict[str, Any]) -> str:
        """The table's row of a check, which it names `<mig_name>-...`, saying what the check probes."""
        row = rows["`" + check["name"].replace(default("mig_name"), "<mig_name>", 1) + "`"]
        assert f"`{check['request_path']}` on port {check['port']}" in row
        assert f"every {check['check_interval_sec']} s, unhealthy after {check['unhealthy_threshold']}" in row
        return row

    assert "the backend service (`health_checks`)" in row_of(backend)
    delay = block(resource(GROUP), "auto_healing_policies")["initial_delay_sec"]
    assert f"the group's `auto_healing_policies`, `initial_delay_sec` {delay}" in row_of(autohealing)


@console.needs_terraform
def test_the_functions_drain_a_member_and_refuse_a_group_autohealing_on_the_backends_check(
    module: Path, compute: Fixture
) -> None:
    # GIVEN a member of the example group, and the group's checks held by Compute Engine as
    # Terraform makes them (global HTTP checks on a fixed port)
    example = example_checks(module, mig_vm_names=MEMBER_NAMES)
    vm, group_name = MEMBER_NAMES[0], default("mig_name")
    assert default("zone") == ZONE_B
    group = f"projects/{PROJECT}/zones/{ZONE_B}/instanceGroupManagers/{group_name}"
    api = compute.api
    api.given(ZONE_B, vm, "2001")
    api.created_by[(PROJECT, ZONE_B, vm)] = f"projects/123456789/zones/{ZONE_B}/instanceGroupManagers/{group_name}"
    for check in example.checks.values():
        api.health_checks[f"projects/{PROJECT}/global/healthChecks/{check['name']}"] = {
            "type": "HTTP",
            "httpHealthCheck": {
                "port": check["port"],
                "portSpecification": "USE_FIXED_PORT",
                "requestPath": check["request_path"],
            },
        }

    def conflict_when_autohealing_on(key: str) -> str | None:
        api.managers[group] = [f"{BASE}/projects/{PROJECT}/global/healthChecks/{example.checks[key]['name']}"]
        guard = MigAutohealers(reader(compute), compute.known_instances().instances_named)
        return guard.conflict(vm)

    # WHEN the group autoheals as the example wires it THEN the functions drain the member
    assert conflict_when_autohealing_on(example.autohealing) is None
    # AND had it autohealed on the backend service's check, they would refuse, naming that check
    refused = conflict_when_autohealing_on(example.backend)
    assert refused is not None
    assert f"autoheals {vm} on the health check {example.checks[example.backend]['name']}" in refused


@console.needs_terraform
@pytest.mark.parametrize(
    ("request_path", "port"),
    [
        ("/healthz", 9797),  # the agent alive: the default
        ("/readyz", 9797),  # the agent's readiness
        ("/readyz?verbose=1", 9797),  # the same: the query is not the path
        ("/readyz", 8080),  # the application's own readiness, on its own port
        ("/health", 8080),  # the application's liveness
        ("/", 9797),
    ],
    ids=["healthz", "readyz", "readyz-query", "app-readyz", "app-health", "root"],
)
def test_the_plan_refuses_exactly_the_autohealing_checks_the_functions_refuse(
    module: Path, request_path: str, port: int
) -> None:
    # GIVEN mig_autohealing_check
    variables = {"mig_autohealing_check": {"request_path": request_path, "port": port}}
    example = example_checks(module, **variables)
    # THEN the plan's verdict is the functions' before a drain
    refused = refuses_drains(example.target(example.autohealing))
    assert bool(example.conflicts) is refused
    if refused:
        [message] = example.conflicts
        assert "mig_autohealing_check probes the agent's readiness (/readyz on port 9797)" in message
        assert "every drained VM would be recreated" in message
    # AND whatever it is, the backend service's check is one the functions would refuse to autoheal on
    assert refuses_drains(example.target(example.backend))


@console.needs_terraform
def test_the_plan_refuses_a_group_autohealing_on_the_backend_services_check(tmp_path: Path) -> None:
    # GIVEN the group's autohealing pointed at the backend service's check
    wired = console_module(
        tmp_path / "gcp", ('mig_autohealing_check_key = "autohealing"', 'mig_autohealing_check_key = "readiness"')
    )
    # THEN the plan is refused for it, and as probing the agent's readiness
    conflicts = example_checks(wired).conflicts
    assert len(conflicts) == 2
    assert conflicts[0].startswith("The group autoheals on the backend service's health check (mbridge-mig-readiness)")
    assert conflicts[1].startswith("mig_autohealing_check probes the agent's readiness")


@console.needs_terraform
def test_the_plan_refuses_a_backend_service_that_would_not_see_a_drain(tmp_path: Path) -> None:
    # GIVEN the backend service's check moved off the agent's readiness
    moved = console_module(tmp_path / "gcp", ("request_path        = local.agent_readiness_path", 'request_path = "/"'))
    # THEN drains through /readyz would not take a member out: refused
    [message] = example_checks(moved).conflicts
    assert message.startswith("The backend service's health check must probe the agent's readiness")


def test_the_group_stops_the_plan_on_every_conflict_and_on_what_the_functions_need() -> None:
    preconditions = {
        entry["condition"]: entry["error_message"] for entry in block(resource(GROUP), "lifecycle")["precondition"]
    }
    # the rule of the two checks, with every sentence that says what is wrong
    assert (
        preconditions.pop("${length(local.mig_health_check_conflicts) == 0}")
        == '${join(" ", local.mig_health_check_conflicts)}'
    )
    # members drained through /readyz, which must be on (it is by default)
    assert "readiness_drain = true" in preconditions.pop("${var.readiness_drain}")
    assert default("readiness_drain") is True
    # a name has one commands subscription
    assert "share" in preconditions.pop("${length(setintersection(var.vm_names, var.mig_vm_names)) == 0}")
    # reports of members are trusted
    trust = preconditions.pop(
        "${contains(local.trust_projects, var.project_id) && "
        "(length(var.trust_zones) == 0 || contains(var.trust_zones, var.zone))}"
    )
    assert "trust_projects and trust_zones" in trust
    assert preconditions == {}


# ---------------------------------------------------------------- opt-in


def mig_resources() -> dict[str, str]:
    """Every resource of mig_example.tf and of the group's identity (iam.tf), with its count or for_each."""
    text = (TERRAFORM_GCP / "mig_example.tf").read_text(encoding="utf-8")
    keys = {f"{kind}.{name}" for kind, name in re.findall(r'^resource "(\w+)" "(\w+)"', text, re.MULTILINE)}
    keys |= {key for key in resources() if ".mig_agent" in key}
    found = {}
    for key in sorted(keys):
        body = resource(key)
        gate = body.get("count", body.get("for_each"))
        assert isinstance(gate, str), f"{key} is made whatever the variables"
        found[key] = gate.removeprefix("${").removesuffix("}")
    return found


@console.needs_terraform
def test_nothing_of_the_group_is_made_unless_it_has_members(module: Path) -> None:
    gates = mig_resources()
    assert {TEMPLATE, CHECKS, GROUP, MEMBERS, BACKEND, SHARED_ACCOUNT} <= set(gates)
    expression = "[" + ", ".join(f"({gate})" for gate in gates.values()) + "]"
    # GIVEN the defaults THEN no resource of the group is made, and the commands subscriptions are
    # the example VMs' alone, as before the group existed
    assert default("mig_vm_names") == []
    assert all(count in (0, [], {}) for count in evaluate(module, expression)), gates
    assert evaluate(module, "local.commands_vm_names") == default("vm_names")
    # WHEN members are named THEN every one is made
    made = evaluate(module, expression, mig_vm_names=MEMBER_NAMES)
    assert all(count not in (0, [], {}) for count in made), dict(zip(gates, made))


# ---------------------------------------------------------------- the members


def test_the_members_run_the_example_vms_agent_from_their_template() -> None:
    template = resource(TEMPLATE)
    # the example VMs' metadata: startup script, installer, unit, environment and package
    assert template["metadata"] == ref("local.agent_metadata")
    assert "metadata_startup_script" not in template
    # private, shielded, live-migrating, reached by the health checks through the firewall rule
    assert "access_config" not in block(template, "network_interface")
    assert block(template, "shielded_instance_config") == {
        "enable_secure_boot": True,
        "enable_vtpm": True,
        "enable_integrity_monitoring": True,
    }
    assert block(template, "scheduling")["on_host_maintenance"] == "MIGRATE"
    assert template["tags"] == ref("local.network_tags")
    assert resource("google_compute_firewall.health_checks")["target_tags"] == ref("local.network_tags")
    # an agent change makes a new template before the old one goes, and needs the package
    lifecycle = block(template, "lifecycle")
    assert lifecycle["create_before_destroy"] is True
    assert template["name_prefix"] == "${var.mig_name}-"
    [precondition] = lifecycle["precondition"]
    assert precondition["condition"] == '${var.agent_package != ""}'


def test_an_agent_change_replaces_the_members_one_at_a_time_keeping_their_names() -> None:
    group = resource(GROUP)
    [version] = group["version"]
    assert version["instance_template"] == ref(f"{TEMPLATE}[0].id")
    assert block(group, "update_policy") == {
        "type": "PROACTIVE",
        "minimal_action": "REPLACE",
        "most_disruptive_allowed_action": "REPLACE",
        # the same name, so the same commands subscription; no surge member, which would need another
        "replacement_method": "RECREATE",
        "max_surge_fixed": 0,
        "max_unavailable_fixed": 1,
    }


@console.needs_terraform
def test_every_member_is_made_by_name_with_its_commands_subscription(module: Path) -> None:
    members = resource(MEMBERS)
    assert members["for_each"] == "${toset(var.mig_vm_names)}"
    assert members["name"] == ref("each.value")
    assert members["instance_group_manager"] == ref(f"{GROUP}[0].name")
    assert members["zone"] == resource(GROUP)["zone"] == ref("var.zone")
    # a name taken out of the list takes its member with it
    assert members["remove_instance_on_destroy"] is True
    # the group makes no member of its own, which would have a random name and no subscription
    assert "target_size" not in resource(GROUP)
    assert not of_type("google_compute_autoscaler")
    assert not of_type("google_compute_region_autoscaler")
    # each member's subscription is on its shard's topic, the shard the functions compute
    variables = {"vm_names": ["web-0"], "mig_vm_names": MEMBER_NAMES, "commands_shards": 3}
    got = evaluate(module, "{names = local.commands_vm_names, shards = local.vm_commands_shards}", **variables)
    assert got["names"] == ["web-0", *MEMBER_NAMES]
    assert got["shards"] == {vm: shard_of(vm, 3) for vm in got["names"]}


def test_the_members_share_their_templates_account_and_nothing_else_holds_it() -> None:
    account = block(resource(TEMPLATE), "service_account")
    assert account["email"] == ref(f"{SHARED_ACCOUNT}[0].email")
    assert account["scopes"] == ["cloud-platform"]
    shared = resource(SHARED_ACCOUNT)
    assert ACCOUNT_ID.fullmatch(shared["account_id"])
    assert not shared["account_id"].startswith("mba-")  # no example VM's account can have its id
    # it publishes events as every agent does (iam.tf), and reads commands through each member's
    # subscription (pubsub.tf); nothing grants it anything else
    assert f"{{for account in {SHARED_ACCOUNT} : " in local("agent_accounts")
    assert f"{{for name in var.mig_vm_names : name => {SHARED_ACCOUNT}[0].email}}" in local("commands_subscribers")
    assert not [key for key, body in resources().items() if SHARED_ACCOUNT in str(body.get("member", ""))]
    # and the group may make members as it, that account alone
    user = resource("google_service_account_iam_member.mig_agent_user")
    assert user["service_account_id"] == ref(f"{SHARED_ACCOUNT}[0].name")
    assert user["role"] == "roles/iam.serviceAccountUser"
    assert user["member"] == "serviceAccount:${data.google_project.this.number}@cloudservices.gserviceaccount.com"


def test_every_group_name_the_plan_takes_names_valid_resources() -> None:
    rule = validation_rule("mig_name")
    taken = [name for name in ("a", "ab", "mbridge-mig", "m" * 30, "m" * 31, "m-", "1m") if rule.fullmatch(name)]
    assert taken == ["a", "ab", "mbridge-mig", "m" * 30]
    for name in taken:
        # the group, its backend service, its checks; and the templates' prefix, which the provider
        # completes with a 26-character unique suffix when it is 37 characters at most
        for derived in (name, f"{name}-readiness", f"{name}-autohealing"):
            assert COMPUTE_NAME.fullmatch(derived), derived
        assert len(f"{name}-") <= 37
