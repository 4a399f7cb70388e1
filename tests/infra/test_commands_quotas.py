"""The commands shards and quota checks of both Terraform roots (commands_shards.tf), evaluated by
`terraform console` with the roots' own variables.tf and commands_shards.tf, without any provider.

GIVEN a fleet, a shard count, a commands mode and the VMs given subscriptions
WHEN  Terraform evaluates the roots' variables and the checks of commands_shards.tf
THEN  the variable validations refuse counts out of range, each quota check refuses exactly the
      configurations past its quota with a message naming the quota and what to change, the
      shard of every VM is wire.shards's, and the checks are a precondition of the plan.

What runs here: Terraform's own evaluation of the variables' validations and of every local the
preconditions read (conditions and messages). What does not: the preconditions firing during a
`terraform plan`, which needs the real providers; the last test checks instead that each
precondition's condition and message are built from exactly the local evaluated here.
"""

from __future__ import annotations

import collections
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.infra import console
from tests.infra.sources import TERRAFORM_AZURE, TERRAFORM_GCP, load_terraform, terraform_resources
from wire.shards import shard_of

pytestmark = console.needs_terraform

PRINCIPAL = "00000000-0000-0000-0000-000000000000"
REQUIRED = {TERRAFORM_AZURE: {"resource_group_name": "rg-mbridge"}, TERRAFORM_GCP: {"project_id": "shop-prod"}}
AZURE_CHECKS = {
    "subscriptions_per_topic",
    "fleet_per_topic",
    "receives_per_entity",
    "connections_per_namespace",
    "servicebus_credits",
    "network_writes",
    "isolation",
}
GCP_CHECKS = {"subscriptions_per_topic", "fleet_per_topic", "subscriptions_per_project"}


@cache
def console_module(root: Path, directory: Path) -> Path:
    module = directory / root.name
    module.mkdir(parents=True)
    for name in ("variables.tf", "commands_shards.tf"):
        shutil.copy(root / name, module / name)
    return module


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    directory = tmp_path_factory.mktemp("quotas")
    return {root: console_module(root, directory) for root in (TERRAFORM_AZURE, TERRAFORM_GCP)}


def evaluate(module: Path, root: Path, variables: dict[str, Any], expression: str) -> Any:
    """`expression` as Terraform evaluates it with `variables`; AssertionError with Terraform's
    message when it refuses them."""
    return console.evaluate(module, expression, {**REQUIRED[root], **variables})


def failing(checks: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: check["message"] for name, check in checks.items() if not check["ok"]}


def azure(modules: dict[Path, Path], **variables: Any) -> dict[str, str]:
    checks = evaluate(modules[TERRAFORM_AZURE], TERRAFORM_AZURE, variables, "local.commands_quota_checks")
    assert set(checks) == AZURE_CHECKS
    return failing(checks)


def gcp(modules: dict[Path, Path], **variables: Any) -> dict[str, str]:
    checks = evaluate(modules[TERRAFORM_GCP], TERRAFORM_GCP, variables, "local.commands_quota_checks")
    assert set(checks) == GCP_CHECKS
    return failing(checks)


# ---------------------------------------------------------------- variables


@pytest.mark.parametrize("root", [TERRAFORM_AZURE, TERRAFORM_GCP], ids=["azure", "gcp"])
@pytest.mark.parametrize(
    ("variables", "refused"),
    [
        ({"commands_shards": 0}, "commands_shards must be a whole number from 1 to 1024"),
        ({"commands_shards": 1025}, "commands_shards must be a whole number from 1 to 1024"),
        ({"commands_shards": 2.5}, "commands_shards must be a whole number from 1 to 1024"),
        ({"fleet_size": 0}, "fleet_size must be a whole number of VMs, at least 1"),
        ({"fleet_size": 10.5}, "fleet_size must be a whole number of VMs, at least 1"),
    ],
)
def test_variables_refuse_counts_out_of_range(
    modules: dict[Path, Path], root: Path, variables: dict[str, Any], refused: str
) -> None:
    with pytest.raises(AssertionError, match=refused):
        evaluate(modules[root], root, variables, "var.commands_shards")


@pytest.mark.parametrize("root", [TERRAFORM_AZURE, TERRAFORM_GCP], ids=["azure", "gcp"])
def test_the_entities_are_the_base_then_numbered(modules: dict[Path, Path], root: Path) -> None:
    name = "commands_entity_names" if root == TERRAFORM_AZURE else "commands_topic_names"
    assert evaluate(modules[root], root, {"commands_shards": 3}, f"local.{name}") == [
        "maintenance-commands",
        "maintenance-commands-1",
        "maintenance-commands-2",
    ]
    assert evaluate(modules[root], root, {}, f"local.{name}") == ["maintenance-commands"]


# ---------------------------------------------------------------- Azure


def test_azure_defaults_pass(modules: dict[Path, Path]) -> None:
    assert azure(modules) == {}
    assert azure(modules, commands_mode="topic", commands_shards=12) == {}


def test_azure_topic_mode_on_standard_is_refused_when_a_freeze_would_outrun_the_credits(
    modules: dict[Path, Path],
) -> None:
    # GIVEN the default 1,000 VMs on one commands topic of a Standard namespace: a freeze of 300
    # sends 600 commands, each evaluated against 1,100 subscription filters
    refused = azure(modules, commands_mode="topic")
    # THEN the credits are refused, naming the shards that fit and Premium
    assert set(refused) == {"servicebus_credits"}
    message = refused["servicebus_credits"]
    assert "Service Bus Standard allows 1000 credits a second per namespace" in message
    assert "needs 662400 credits" in message
    assert "Raise commands_shards to at least 12 (fewer VMs per commands topic)" in message
    assert 'servicebus_sku = "Premium"' in message
    # AND 12 shards fit (92 filters a command: 300 x (4 + 2 x 94) = 57,600), as does Premium
    assert azure(modules, commands_mode="topic", commands_shards=12) == {}
    assert azure(modules, commands_mode="topic", servicebus_sku="Premium") == {}
    # AND the queue mode, with no filters per command, is far from it: 2,400 x 8 at 8,000 VMs
    assert "servicebus_credits" not in azure(modules, fleet_size=8000, commands_shards=2)


def test_azure_vms_with_identities_of_their_own_are_refused_the_queue_mode(modules: dict[Path, Path]) -> None:
    vms = {"commands_subscription_vms": {"web-0": PRINCIPAL, "web-1": PRINCIPAL}}
    refused = azure(modules, **vms)
    assert set(refused) == {"isolation"}
    assert 'set commands_mode = "topic" to give each its own subscription' in refused["isolation"]
    assert azure(modules, commands_mode="topic", commands_shards=12, **vms) == {}


def test_azure_pool_drains_past_the_network_writes_a_freeze_can_use_are_refused(modules: dict[Path, Path]) -> None:
    lb = {"drain_load_balancer_name": "lb-web", "drain_virtual_network_name": "vnet-web"}
    # GIVEN 9,333 VMs drained through pools: a freeze's 2,800 NIC PUTs fit the 14 minutes
    assert "network_writes" not in azure(modules, fleet_size=9333, commands_shards=2, **lb)
    # WHEN the fleet is 9,340: 2,802 PUTs
    refused = azure(modules, fleet_size=9340, commands_shards=2, **lb)
    # THEN the network writes are refused, with the way out; without pool drains there are none
    message = refused["network_writes"]
    assert "1000 network writes (PUT) per 300 s per subscription and region" in message
    assert "makes 2802 drains, more than the 2800" in message
    assert "Drain through /readyz instead" in message
    assert "network_writes" not in azure(modules, fleet_size=9340, commands_shards=2)


def test_azure_peak_receives_per_entity_past_5000_are_refused_and_shards_cure_them(modules: dict[Path, Path]) -> None:
    # GIVEN 17,000 VMs, 30 % engaged: 5,100 receives on one queue
    refused = azure(modules, fleet_size=17000)
    assert "receives_per_entity" in refused
    assert "5000 concurrent receive requests per queue or topic" in refused["receives_per_entity"]
    assert "make 5100 on one. Raise commands_shards to at least 2" in refused["receives_per_entity"]
    # THEN two queues take 2,550 each (the namespace's connections are another matter)
    assert "receives_per_entity" not in azure(modules, fleet_size=17000, commands_shards=2)


def test_azure_peak_connections_past_5000_are_refused_with_a_split_of_the_fleet(modules: dict[Path, Path]) -> None:
    # GIVEN 8,000 VMs over 2 queues: 4,800 agents' connections and 40 x 3 = 120 for the function app
    assert azure(modules, fleet_size=8000, commands_shards=2) == {}
    # WHEN the fleet grows by 200 VMs: 4,920 + 120 = 5,040
    refused = azure(modules, fleet_size=8200, commands_shards=2)
    # THEN the namespace's connections are refused, and more shards cannot help
    assert set(refused) == {"connections_per_namespace"}
    message = refused["connections_per_namespace"]
    assert "5000 concurrent AMQP connections per namespace" in message
    assert "make 5040" in message
    assert "split the fleet over several deployments, each in its own resource group" in message
    assert set(azure(modules, fleet_size=8200, commands_shards=16)) == {"connections_per_namespace"}
    # AND the function app cannot be narrowed below Flex Consumption's 40: 8,100 VMs fit, 4,860 + 40 x 3
    assert azure(modules, fleet_size=8100, commands_shards=2, function_maximum_instance_count=40) == {}


def test_azure_topic_mode_refuses_more_vms_on_a_topic_than_subscriptions_allowed(modules: dict[Path, Path]) -> None:
    # GIVEN a fleet of 2,000 VMs: with 10 % headroom, 2,200 subscriptions on one topic
    # (on Premium: Standard's credits would want far more shards, tested above)
    premium = {"commands_mode": "topic", "servicebus_sku": "Premium"}
    refused = azure(modules, fleet_size=2000, **premium)
    assert set(refused) == {"fleet_per_topic"}
    assert "2000 subscriptions per topic" in refused["fleet_per_topic"]
    assert "Raise commands_shards to at least 2" in refused["fleet_per_topic"]
    # THEN two topics take it, and the queue mode has no subscriptions to count
    assert azure(modules, fleet_size=2000, commands_shards=2, **premium) == {}
    assert azure(modules, fleet_size=2000) == {}


def test_azure_counts_the_subscriptions_it_creates_on_each_topic_as_wire_shards_does(modules: dict[Path, Path]) -> None:
    # GIVEN 2,001 VMs given subscriptions (fleet_size left small: only the exact count can refuse)
    vms = {f"web-{i:04d}": PRINCIPAL for i in range(2001)}
    variables = {"commands_mode": "topic", "commands_subscription_vms": vms, "fleet_size": 1}
    # THEN on one topic that is one too many, and the message says how many
    refused = azure(modules, **variables)
    assert set(refused) == {"subscriptions_per_topic"}
    assert "2000 subscriptions per topic" in refused["subscriptions_per_topic"]
    assert "puts 2001 VMs on one commands topic" in refused["subscriptions_per_topic"]
    # AND over 3 topics each VM's subscription is on its shard's topic as wire.shards computes it
    module = modules[TERRAFORM_AZURE]
    shards = evaluate(
        module, TERRAFORM_AZURE, {**variables, "commands_shards": 3}, "local.commands_subscription_shards"
    )
    assert shards == {vm: shard_of(vm, 3) for vm in vms}
    counts = collections.Counter(shards.values())
    assert evaluate(module, TERRAFORM_AZURE, {**variables, "commands_shards": 3}, "local.subscriptions_per_topic") == [
        counts[0],
        counts[1],
        counts[2],
    ]
    assert azure(modules, **variables, commands_shards=3) == {}


# ---------------------------------------------------------------- Google Cloud


def test_gcp_defaults_pass(modules: dict[Path, Path]) -> None:
    assert gcp(modules) == {}


def test_gcp_refuses_more_vms_on_a_topic_than_subscriptions_allowed(modules: dict[Path, Path]) -> None:
    # GIVEN 9,500 VMs: with 10 % headroom, 10,450 subscriptions on one topic
    refused = gcp(modules, fleet_size=9500)
    assert set(refused) == {"fleet_per_topic"}
    assert "10000 subscriptions per topic" in refused["fleet_per_topic"]
    assert "Raise commands_shards to at least 2" in refused["fleet_per_topic"]
    # THEN two topics take them
    assert gcp(modules, fleet_size=9500, commands_shards=2) == {}


def test_gcp_refuses_more_subscriptions_than_a_project_allows_with_a_split_over_projects(
    modules: dict[Path, Path],
) -> None:
    # GIVEN 9,997 VMs and the deployment's 3 subscriptions: 10,000
    assert gcp(modules, fleet_size=9997, commands_shards=2) == {}
    # WHEN one more VM THEN the project's hard limit is refused, whatever the shards
    refused = gcp(modules, fleet_size=9998, commands_shards=64)
    assert set(refused) == {"subscriptions_per_project"}
    message = refused["subscriptions_per_project"]
    assert "10000 subscriptions per project, a hard limit" in message
    assert "make 10001" in message
    assert "split the fleet over several deployments, each in its own project" in message


def test_gcp_counts_the_subscriptions_it_creates_on_each_topic_as_wire_shards_does(modules: dict[Path, Path]) -> None:
    vms = [f"web-{i}" for i in range(300)]
    module = modules[TERRAFORM_GCP]
    variables = {"vm_names": vms, "commands_shards": 4}
    assert evaluate(module, TERRAFORM_GCP, variables, "local.vm_commands_shards") == {vm: shard_of(vm, 4) for vm in vms}
    counts = collections.Counter(shard_of(vm, 4) for vm in vms)
    assert evaluate(module, TERRAFORM_GCP, variables, "local.subscriptions_per_topic") == [counts[k] for k in range(4)]


def test_gcp_counts_the_example_groups_members_as_vms_with_subscriptions(modules: dict[Path, Path]) -> None:
    # GIVEN example VMs and members of the example managed instance group, each with its commands
    # subscription (fleet_size left small: only the count of the named VMs can set the total)
    module = modules[TERRAFORM_GCP]
    variables = {"vm_names": ["web-0"], "mig_vm_names": ["mig-0", "mig-1", "mig-2"], "fleet_size": 1}
    # THEN the project holds a subscription for each, besides the deployment's 3
    assert evaluate(module, TERRAFORM_GCP, variables, "local.project_subscriptions") == 4 + 3
    # AND a name in both lists, one subscription, is counted once (the group's precondition refuses it)
    both = {**variables, "mig_vm_names": ["web-0", "mig-0"]}
    assert evaluate(module, TERRAFORM_GCP, both, "local.project_subscriptions") == 2 + 3
    # AND each member's subscription is on its shard's topic, counted there, as wire.shards computes it
    sharded = {**variables, "commands_shards": 2}
    shards = evaluate(module, TERRAFORM_GCP, sharded, "local.vm_commands_shards")
    assert shards == {vm: shard_of(vm, 2) for vm in ["web-0", "mig-0", "mig-1", "mig-2"]}
    counts = collections.Counter(shards.values())
    assert evaluate(module, TERRAFORM_GCP, sharded, "local.subscriptions_per_topic") == [counts[0], counts[1]]
    assert gcp(modules, **sharded) == {}


# ---------------------------------------------------------------- each check is a precondition of the plan


@pytest.mark.parametrize(
    ("root", "address"),
    [(TERRAFORM_AZURE, "azurerm_servicebus_namespace.this"), (TERRAFORM_GCP, "google_pubsub_topic.commands")],
    ids=["azure", "gcp"],
)
def test_the_checks_are_one_precondition_saying_every_failed_message(root: Path, address: str) -> None:
    body = terraform_resources(load_terraform(root))[address]
    preconditions = [entry for lifecycle in body["lifecycle"] for entry in lifecycle.get("precondition", [])]
    assert {
        "condition": "${alltrue([for check in values(local.commands_quota_checks) : check.ok])}",
        "error_message": '${join(" ", '
        "[for check in values(local.commands_quota_checks) : check.message if !check.ok])}",
    } in preconditions
