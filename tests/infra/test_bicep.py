"""What the Bicep deployment (infra/azure/) must hold beyond the shared contract.

GIVEN the Bicep files read with pycep (the parser checkov uses), modules followed from main.bicep
WHEN  their declarations are traced to where each value is written
THEN  they are deployable as written: parameters and the parameters file agree, role
      assignments use the documented built-in roles under deterministic names, the agent's
      custom data is complete, and nothing reads a key.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
from typing import Any

import pytest

from tests.infra import bicep_facts
from tests.infra.azure_facts import (
    AGENT,
    DRAINER_ROLE,
    FUNCTION,
    SCOPE_COMMANDS_QUEUE,
    SCOPE_COMMANDS_TOPIC,
    SCOPE_EVENTS_TOPIC,
    SCOPE_SIGNING_SECRET,
    RoleGrant,
    commands_entity_scope,
    commands_subscription_scope,
    duration_seconds,
    vm_principal,
)
from tests.infra.bicep_facts import (
    BUILT_IN_ROLES,
    LOAD_BALANCER,
    QUEUE,
    ROLE_DEFINITION,
    SCALE_SET,
    TOPIC,
    Choice,
    Deployment,
    Expr,
    Lit,
    ParamRef,
    Ref,
    Resolved,
    Resource,
    Unit,
    custom_data,
    deref,
    render,
    resolve,
    resolve_symbol,
    truth,
    value_of,
)
from tests.infra.sources import AGENT_INSTALL, BICEP_DIR, REPO_ROOT, load_bicep
from wire.shards import entity_for, shard_of, sharded_name

PARAMETERS_FILE = BICEP_DIR / "main.parameters.json"
BICEP_FILES = sorted(BICEP_DIR.rglob("*.bicep"))
PLACEHOLDERS = {"@@AGENT_ENV_B64@@", "@@AGENT_UNIT_B64@@", "@@INSTALL_SCRIPT_B64@@", "@@INSTALL_ENV_B64@@"}
# What the agent's environment file sets (docs/contracts.md#transport-options, docs/agent.md, docs/transports.md).
AGENT_ENVIRONMENT_KEYS = {
    "MBRIDGE_CLOUD",
    "MBRIDGE_TRANSPORT",
    "MBRIDGE_SERVICEBUS_NAMESPACE",
    "AZURE_CLIENT_ID",
    "MBRIDGE_LISTEN",
    "MBRIDGE_VERIFY_KEY",
    "MBRIDGE_COMMANDS_SHARDS",
}
# Azure refuses custom data above 64 KB (the base64 text).
CUSTOM_DATA_LIMIT = 65535
# Resource types whose newest non-preview API version is older than 2022: the version they must use.
OLDER_STABLE_API = {"Microsoft.Insights/components": "2020-02-02"}
# Resource types that have no stable API version of the shape in use: the preview version they must use.
# Microsoft.Insights/diagnosticSettings: the stable 2016-09-01 is the older per-resource `service`
# setting (a location, metrics by time grain, no category groups); Azure Verified Modules and
# azurerm use 2021-05-01-preview.
PREVIEW_ONLY_API = {"Microsoft.Insights/diagnosticSettings": "2021-05-01-preview"}
# Functions of what Azure decides at deployment time (endpoints, ids): a stand-in value is used.
COMPUTED_BY_AZURE = {"split", "unique_string", "resource_group", "subscription"}
GUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(scope="module")
def topic_deployment() -> Deployment:
    """The isolated mode, with two VMs of their own identities."""
    vms = [
        {"name": "web-0", "principalId": "11111111-1111-4111-8111-111111111111"},
        {"name": "db-1", "principalId": "22222222-2222-4222-8222-222222222222"},
    ]
    return Deployment(parameters={"commandsMode": "topic", "commandsSubscriptionVms": vms})


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    """The deployment in the queue mode (commandsMode's default); test_azure_contract.py and the
    tests below read the topic mode too."""
    return Deployment(parameters={"commandsMode": "queue"})


def _function(resolved: Resolved) -> tuple[Unit, dict[str, Any]]:
    """(unit, pycep function node) of an expression that is one function call."""
    resolved = deref(resolved)
    assert isinstance(resolved, Expr), f"not a function call: {render(resolved)}"
    assert isinstance(resolved.node, dict), f"not a function call: {render(resolved)}"
    assert "function" in resolved.node, f"not a function call: {render(resolved)}"
    function: dict[str, Any] = resolved.node["function"]
    return resolved.unit, function


def _argument(unit: Unit, function: dict[str, Any], name: str) -> Resolved:
    return resolve(unit, function["parameters"][name])


def _drain_parameters(**overrides: str) -> dict[str, str]:
    parameters = {
        "drainLoadBalancerName": "lb-web",
        "drainLoadBalancerResourceGroup": "rg-network",
        "drainNicResourceGroup": "rg-vms",
        "drainVirtualNetworkName": "vnet-web",
        "drainVirtualNetworkResourceGroup": "rg-network",
        # The topic mode's check of commandsSubscriptionVms depends on them: the queue mode has none.
        "commandsMode": "queue",
    }
    parameters.update(overrides)
    return parameters


# --- the files -----------------------------------------------------------------------------


def test_every_bicep_file_parses_and_is_deployed_from_main(deployment: Deployment) -> None:
    # GIVEN every .bicep file under infra/azure/
    assert BICEP_FILES, "no Bicep files found"
    for path in BICEP_FILES:
        # WHEN pycep parses it THEN it declares something (check.bicep: the parameter whose
        # validation stops a deployment)
        document = load_bicep(path)
        assert document.get("resources") or document.get("modules") or path == bicep_facts.CHECK, path
    # AND every module file is reached from main.bicep (no file is left out of the deployment)
    deployed = {unit.path for unit in deployment.units}
    assert {path.resolve() for path in BICEP_FILES} == deployed


def test_api_versions_are_stable_and_not_older_than_2022() -> None:
    # GIVEN every resource declaration THEN its API version is a stable one from 2022 or later,
    # or the newest stable one of a type that has none that recent, or the one preview of a type
    # that has no stable version of that shape
    for path in BICEP_FILES:
        for symbol, declaration in (load_bicep(path).get("resources") or {}).items():
            version, kind = declaration["api_version"], declaration["type"]
            where = f"{path.name}: {symbol} ({kind}@{version})"
            if kind in PREVIEW_ONLY_API:
                assert version == PREVIEW_ONLY_API[kind], where
                continue
            assert "preview" not in version, where
            if kind in OLDER_STABLE_API:
                assert version == OLDER_STABLE_API[kind], where
            else:
                assert version >= "2022-01-01", where


def test_no_key_is_listed_or_written_anywhere() -> None:
    # GIVEN the text of every Bicep file THEN no key is read (listKeys(), listConnectionStrings())
    # and no SAS or account key is written: everything authenticates with Entra ID
    forbidden = ("listKeys(", "listConnectionStrings(", "listSecrets(", "SharedAccessKey", "AccountKey=")
    for path in BICEP_FILES:
        text = path.read_text(encoding="utf-8")
        for word in forbidden:
            assert word not in text, f"{path.name} contains {word}"


# --- parameters ----------------------------------------------------------------------------


def test_parameters_file_sets_declared_parameters_with_allowed_values(deployment: Deployment) -> None:
    # GIVEN main.bicep's parameters and the example parameters file
    declared = load_bicep(BICEP_DIR / "main.bicep")["parameters"]
    document = json.loads(PARAMETERS_FILE.read_text(encoding="utf-8"))
    assert document["$schema"].endswith("/deploymentParameters.json#")
    given = document["parameters"]
    # THEN it names only declared parameters, and every parameter without a default
    assert set(given) <= set(declared), f"undeclared: {sorted(set(given) - set(declared))}"
    required = {name for name, parameter in declared.items() if "default" not in parameter}
    assert required <= set(given), f"missing: {sorted(required - set(given))}"
    # AND each value passes the parameter's own validation
    for name, entry in given.items():
        assert not bicep_facts.parameter_refusal(deployment.main, name, entry["value"])
    # AND the example really deploys the scale set, asking the user for a key
    assert given["deployExampleScaleSet"]["value"] is True
    assert given["adminSshPublicKey"]["value"] == "<your ssh public key>"


def test_name_prefix_fits_the_storage_account_name(deployment: Deployment) -> None:
    # GIVEN namePrefix, validated to 3-11 characters
    parameter = deployment.main.section("parameters")["namePrefix"]
    lengths = {d["type"]: d["argument"] for d in parameter["decorators"] if d["type"] in ("min_length", "max_length")}
    assert lengths == {"min_length": 3, "max_length": 11}
    given = json.loads(PARAMETERS_FILE.read_text(encoding="utf-8"))["parameters"]["namePrefix"]["value"]
    for prefix in (parameter["default"], given):
        assert re.fullmatch(r"[a-z0-9]{3,11}", prefix), prefix
    # WHEN the storage account is named THEN it is the prefix and uniqueString() (13 characters):
    # at most 24 lowercase letters and digits, the storage account rule
    assert render(deployment.storage_account().get("name")) == "${namePrefix}${uniqueString(resourceGroup().id)}"


def test_duplicate_detection_window_choices_are_at_least_ten_minutes(deployment: Deployment) -> None:
    # GIVEN the choices of the events topic's duplicate detection window
    # THEN each is at least 10 minutes and at most 7 days (the Service Bus maximum)
    main = deployment.main.section("parameters")["eventsDuplicateDetectionWindow"]
    allowed = next(d["argument"] for d in main["decorators"] if d["type"] == "allowed")
    assert main["default"] == "P1D"
    assert all(10 * 60 <= duration_seconds(window) <= 7 * 86400 for window in allowed), allowed
    # AND the module validates the same choices when it is used on its own
    window = deployment.events_topic().get("properties", "duplicateDetectionHistoryTimeWindow")
    assert isinstance(window, ParamRef)
    assert window.name == "eventsDuplicateDetectionWindow"
    module = next(unit for unit in deployment.units if unit.path.name == "servicebus.bicep")
    own = module.section("parameters")["eventsDuplicateDetectionWindow"]["decorators"]
    assert next(d["argument"] for d in own if d["type"] == "allowed") == allowed


def test_terminate_not_before_choices_agree_in_main_and_module(deployment: Deployment) -> None:
    # GIVEN the terminate notification timeout parameter of main.bicep and of the scale set module
    # THEN both accept exactly 5 to 15 minutes, the range Azure takes
    module = next(unit for unit in deployment.units if unit.path.name == "vmss-example.bicep")
    main = deployment.main.section("parameters")["terminateNotBeforeTimeout"]["decorators"]
    own = module.section("parameters")["terminateNotBeforeTimeout"]["decorators"]
    expected = [f"PT{minutes}M" for minutes in range(5, 16)]
    assert next(d["argument"] for d in main if d["type"] == "allowed") == expected
    assert next(d["argument"] for d in own if d["type"] == "allowed") == expected


def test_telemetry_choices_agree_in_main_and_module_and_refuse_any_other(deployment: Deployment) -> None:
    # GIVEN the telemetry parameter of main.bicep and of the function app module
    module = next(unit for unit in deployment.units if unit.path.name == "functionapp.bicep")
    main = deployment.main.section("parameters")["telemetry"]
    own = module.section("parameters")["telemetry"]
    # THEN both take off and azure-monitor only, main.bicep off by default, the module from main.bicep
    expected = ["off", "azure-monitor"]
    assert next(d["argument"] for d in main["decorators"] if d["type"] == "allowed") == expected
    assert next(d["argument"] for d in own["decorators"] if d["type"] == "allowed") == expected
    assert main["default"] == "off"
    assert own.get("default") is None
    assert module.arguments["telemetry"] == "telemetry"
    # WHEN it is deployed with each THEN the app setting MBRIDGE_TELEMETRY is that value
    assert render(deployment.settings["MBRIDGE_TELEMETRY"]) == "telemetry"
    for value in expected:
        chosen = Deployment(parameters={"commandsMode": "queue", "telemetry": value})
        assert value_of(chosen.settings["MBRIDGE_TELEMETRY"]) == value
    # AND another exporter's name, or another spelling, is refused before anything is deployed
    for value in ("gcp", "Azure-Monitor", "on", ""):
        with pytest.raises(bicep_facts.ParameterRefused, match=f"The value '{value}' is not part of the allowed"):
            Deployment(parameters={"commandsMode": "queue", "telemetry": value})


# --- roles ---------------------------------------------------------------------------------


def test_role_ids_are_the_built_in_roles_their_names_say(deployment: Deployment) -> None:
    # GIVEN every role id variable (`<role>RoleId = '<guid>'`) of the deployment
    role_variables = {
        (unit.path.name, name): variable["value"]
        for unit in deployment.units
        for name, variable in unit.section("variables").items()
        if name.endswith("RoleId")
    }
    assert len(role_variables) >= 5
    for (file, name), guid in role_variables.items():
        # THEN each is a documented built-in role, the one the variable is named after
        assert isinstance(guid, str), f"{file}: {name} = {guid!r}"
        assert GUID.match(guid), f"{file}: {name} = {guid!r}"
        assert guid in BUILT_IN_ROLES, f"{file}: {name} = {guid} is not a documented built-in role"
        role = re.sub(r"^Azure ", "", BUILT_IN_ROLES[guid])
        assert name.removesuffix("RoleId").lower() == role.replace(" ", "").lower(), f"{file}: {name} = {role}"
    # AND the table maps each id once
    assert len(set(BUILT_IN_ROLES.values())) == len(BUILT_IN_ROLES)
    assert all(GUID.match(guid) for guid in BUILT_IN_ROLES)


def test_role_assignment_names_are_guids_of_scope_principal_and_role(deployment: Deployment) -> None:
    assignments = deployment.assignments()
    # 13, and the control plane's path: the system topic's sender and the function's receiver
    assert len(assignments) == 15
    assert_guid_names(assignments)


def test_in_the_topic_mode_role_assignment_names_are_guids_too(topic_deployment: Deployment) -> None:
    # GIVEN the topic mode with two VMs: the function's sender on the topic replaces its sender and
    # the agents' receiver on the queue; each VM adds its receiver and its events sender
    assignments = topic_deployment.assignments()
    assert len(assignments) == 15 - 2 + 1 + 2 * 2
    assert_guid_names(assignments)


def assert_guid_names(assignments: list[bicep_facts.Resource]) -> None:
    for assignment in assignments:
        where = f"{assignment.unit.path.name}: {assignment.symbol}"
        unit, function = _function(assignment.get("name"))
        # WHEN the name is computed THEN it is guid(scope id, principal, role): stable across
        # deployments, and different for every (scope, principal, role)
        assert function["type"] == "guid", where
        scope, principal, role = function["parameters"].values()
        scope_symbol = assignment.config.get("scope")
        if scope_symbol is None:
            assert render(resolve(unit, scope)) == "resourceGroup().id", where
        else:
            assert resolve(unit, scope) == Ref(unit, scope_symbol, ("id",)), where
        principal_id = assignment.config["properties"]["principalId"]
        system_assigned = resolve(unit, principal_id)
        if isinstance(system_assigned, Ref) and system_assigned.path == ("identity", "principalId"):
            # A system-assigned identity's id is known only once its resource exists, and the name
            # must be known before: the resource's name stands for it
            name_of_it = {
                "type": "property_accessor",
                "operands": {"operand_1": system_assigned.symbol, "operand_2": "name"},
            }
            assert principal == {"operator": name_of_it}, where
        else:
            assert principal == principal_id, where
        role_definition = assignment.config["properties"]["roleDefinitionId"]
        if isinstance(role_definition, dict):  # subscriptionResourceId('...roleDefinitions', <role id>)
            role_definition = role_definition["function"]["parameters"]["resource_name_1"]
        assert role == role_definition, where
        # AND the principal is a service principal (managed identity): no Graph lookup, no
        # replication race right after the identity is created
        assert assignment.value("properties", "principalType") == "ServicePrincipal", where


def test_agent_receiver_on_the_queue_carries_the_session_caveat(deployment: Deployment) -> None:
    # GIVEN the agents' receiver assignment on the commands queue
    [assignment] = [
        a
        for a in deployment.assignments()
        if deployment.principal_of(a) == AGENT and deployment.scope_of(a) == SCOPE_COMMANDS_QUEUE
    ]
    lines = assignment.unit.path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"resource {assignment.symbol} "))
    comment = " ".join(line.strip("/ ") for line in lines[max(0, start - 8) : start] if line.startswith("//"))
    # THEN the comment right above it says what the role cannot restrict
    # (docs/security.md#commands-on-azure-who-can-take-them)
    assert "cannot be scoped to a session" in comment
    assert "NotBefore" in comment


def test_without_a_drain_load_balancer_nothing_but_data_roles_is_granted() -> None:
    # GIVEN a deployment without a drain load balancer
    deployment = Deployment(parameters={"drainLoadBalancerName": ""})
    # THEN no custom role is defined or assigned, and the function's load balancer settings are empty
    assert deployment.resources(ROLE_DEFINITION) == []
    grants = deployment.grants()
    assert grants
    assert all(grant.role != DRAINER_ROLE for grant in grants)
    for name in ("MBRIDGE_LB_SUBSCRIPTION_ID", "MBRIDGE_LB_RESOURCE_GROUP", "MBRIDGE_LB_NAME"):
        assert deployment.settings[name] == "", name
    assert deployment.settings["MBRIDGE_LB_NIC_RESOURCE_GROUP"] == ""


def test_drain_roles_go_to_the_resource_groups_of_the_drain_target() -> None:
    # GIVEN a load balancer, its NICs and its virtual network in other resource groups
    deployment = Deployment(parameters=_drain_parameters())
    # WHEN the drainer role is assigned
    drains = [a for a in deployment.assignments() if deployment.role_of(a) == DRAINER_ROLE]
    placed = {deployment.scope_of(a): deployment.resource_group_of(a.unit) for a in drains}
    # THEN each assignment is deployed into the resource group of what it grants on
    assert placed == {"load_balancer": "rg-network", "nic_resource_group": "rg-vms", "virtual_network": "rg-network"}
    assert all(deployment.principal_of(a) == FUNCTION for a in drains)
    # AND the role can be assigned there: its assignable scopes are those groups and this one
    [role] = deployment.resources(ROLE_DEFINITION)
    scopes = []
    for scope in bicep_facts.array_items(role.get("properties", "assignableScopes")):
        unit, lowered = _function(scope)
        assert lowered["type"] == "to_lower"  # ARM ids compare case-insensitively: one entry per group
        scopes.append(bicep_facts.source_text(_argument(unit, lowered, "string_to_change")))
    assert scopes == [
        "${resourceGroup().id}",
        "${subscription().id}/resourceGroups/rg-network",
        "${subscription().id}/resourceGroups/rg-vms",
        "${subscription().id}/resourceGroups/rg-network",
    ]
    # AND the function app is told where to drain
    settings = deployment.settings
    assert (settings["MBRIDGE_LB_NAME"], settings["MBRIDGE_LB_RESOURCE_GROUP"]) == ("lb-web", "rg-network")
    assert settings["MBRIDGE_LB_NIC_RESOURCE_GROUP"] == "rg-vms"
    assert render(settings["MBRIDGE_LB_SUBSCRIPTION_ID"]) == "subscription().subscriptionId"


def test_drain_defaults_to_the_load_balancer_resource_group() -> None:
    # GIVEN only a load balancer name (and its virtual network)
    deployment = Deployment(
        parameters=_drain_parameters(
            drainLoadBalancerResourceGroup="", drainNicResourceGroup="", drainVirtualNetworkResourceGroup=""
        )
    )
    drains = [a for a in deployment.assignments() if deployment.role_of(a) == DRAINER_ROLE]
    # THEN everything is granted in the deployment's own resource group
    groups = {render(deployment.resource_group_of(a.unit)) for a in drains}
    assert groups == {"resourceGroup().name"}
    assert len(drains) == 3


def test_without_a_virtual_network_name_the_deployment_stops_before_any_drain_role() -> None:
    # GIVEN a drain load balancer but no virtual network name
    deployment = Deployment(parameters=_drain_parameters(drainVirtualNetworkName=""))
    # THEN the check refuses it, with a sentence naming the parameter to set
    refusal = bicep_facts.refusal(deployment)
    assert refusal.startswith("drainVirtualNetworkName must be set with drainLoadBalancerName")
    # AND the role definition waits for that check, and every drain assignment for the definition
    # (its id reads drainerRole.name), so nothing of the drain is granted before the refusal
    [role] = deployment.resources(ROLE_DEFINITION)
    assert role.config.get("dependsOn") == ["drainTargetCheck"]
    check = deployment.main.section("modules")["drainTargetCheck"]
    assert check["detail"]["path"] == "modules/check.bicep"
    for assignment in deployment.assignments():
        if deployment.role_of(assignment) == DRAINER_ROLE:
            name = bicep_facts.subscription_role_name(assignment.get("properties", "roleDefinitionId"))
            assert render(resolve(deployment.main, name)) == render(role.get("name"))
    # AND without a drain load balancer there is nothing to check
    assert bicep_facts.refusal(Deployment(parameters={"drainLoadBalancerName": "", "commandsMode": "queue"})) == ""


def test_the_example_scale_set_needs_an_agent_package() -> None:
    # GIVEN the example scale set without an agent package (the parameter has no default: the
    # installer takes only a pinned package, and none is published on an index)
    assert Deployment().main.section("parameters")["agentPackage"]["default"] == ""
    example = {"deployExampleScaleSet": True, "commandsMode": "queue", "drainLoadBalancerName": ""}
    refused = Deployment(parameters={**example, "agentPackage": ""})
    # THEN the check refuses it, naming the parameter and the form to give
    refusal = bicep_facts.refusal(refused)
    assert refusal.startswith("agentPackage is required with deployExampleScaleSet")
    assert "#sha256=" in refusal
    # AND the scale set waits for that check; with a package, nothing is refused
    scale_set = refused.main.section("modules")["exampleScaleSet"]
    assert scale_set["config"]["config"]["dependsOn"] == ["agentPackageCheck"]
    assert bicep_facts.refusal(Deployment(parameters=example)) == ""


def test_the_check_module_takes_ok_only_and_deploys_nothing() -> None:
    # GIVEN modules/check.bicep; THEN its one parameter accepts 'ok' and nothing else, has no
    # default to fall back on, and the module deploys no resource and returns nothing
    document = load_bicep(bicep_facts.CHECK)
    assert set(document["parameters"]) == {"outcome"}
    decorators = {d["type"]: d.get("argument") for d in document["parameters"]["outcome"]["decorators"]}
    assert decorators["allowed"] == ["ok"]
    assert document["parameters"]["outcome"].get("default") is None
    for section in ("resources", "modules", "outputs"):
        assert not document.get(section), section


def test_every_role_assignment_names_its_role_by_its_subscription_level_id() -> None:
    # GIVEN every role assignment of the deployment, in both commands modes and with a drain target
    vm = {"name": "web-0", "principalId": "11111111-1111-4111-8111-111111111111"}
    deployments = [
        Deployment(parameters={"commandsMode": "queue", **_drain_parameters()}),
        Deployment(parameters={"commandsMode": "topic", "commandsSubscriptionVms": [vm], **_drain_parameters()}),
    ]
    for deployment in deployments:
        assignments = deployment.assignments()
        assert sum(deployment.role_of(a) == DRAINER_ROLE for a in assignments) == 3
        for assignment in assignments:
            # THEN roleDefinitionId is subscriptionResourceId('Microsoft.Authorization/roleDefinitions',
            # <guid>) in the deployment's subscription, for the built-in roles and the drainer alike:
            # never the resource-group-scoped id a role definition resource's `.id` gives
            definition = assignment.get("properties", "roleDefinitionId")
            where = f"{assignment.unit.path.name}: {assignment.symbol}: {render(definition)}"
            assert bicep_facts.subscription_role_name(definition) is not None, where


# --- the function app ----------------------------------------------------------------------


def test_function_app_settings_come_from_the_deployed_resources(deployment: Deployment) -> None:
    # GIVEN the function app's settings, each traced to where its value is written
    settings = deployment.settings
    identity = deployment.function_identity()
    client_id = Ref(identity.unit, identity.symbol, ("properties", "clientId"))
    # THEN one identity serves everything: host storage, trigger, our adapters, telemetry
    for name in ("AZURE_CLIENT_ID", "MBRIDGE_SERVICEBUS__clientId", "AzureWebJobsStorage__clientId"):
        assert settings[name] == client_id, name
    assert bicep_facts.source_text(settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"]) == (
        "Authorization=AAD;ClientId=${" + render(client_id) + "}"
    )
    # AND the entities are named as they are deployed
    assert settings["MBRIDGE_EVENTS_TOPIC"] == deployment.events_topic().get("name")
    assert settings["MBRIDGE_EVENTS_SUBSCRIPTION"] == deployment.function_subscription().get("name")
    assert settings["MBRIDGE_COMMANDS_QUEUE"] == deployment.commands_queue().get("name")
    # a parameter (readinessDrain, default true), as the Terraform's readiness_drain
    assert render(settings["MBRIDGE_READINESS_DRAIN"]) == "readinessDrain ? 'true' : 'false'"
    policy = settings["MBRIDGE_POLICY"]
    assert isinstance(policy, ParamRef)
    assert policy.name == "policy"
    assert value_of(policy) == ""
    # AND endpoints come from the resources themselves, never assembled from names
    namespace = deployment.one(bicep_facts.NAMESPACE)
    assert render(settings["MBRIDGE_SERVICEBUS__fullyQualifiedNamespace"]) == (
        f"split(split({namespace.symbol}.properties.serviceBusEndpoint, '/')[2], ':')[0]"
    )
    table_endpoint = settings["MBRIDGE_TABLE_ENDPOINT"]
    assert isinstance(table_endpoint, Ref)
    assert table_endpoint.path == ("properties", "primaryEndpoints", "table")
    account_name = render(deployment.storage_account().get("name"))
    assert render(deployment.resource_of(Ref(table_endpoint.unit, table_endpoint.symbol)).get("name")) == account_name
    assert render(settings["AzureWebJobsStorage__accountName"]) == account_name


def _secure_parameter(unit: Unit, name: str) -> dict[str, Any]:
    parameter: dict[str, Any] = unit.section("parameters")[name]
    assert any(d["type"] == "secure" for d in parameter.get("decorators") or []), f"{name} is not @secure()"
    return parameter


def test_signing_key_is_always_a_key_vault_reference() -> None:
    # GIVEN no secret URI THEN the secure parameter signingKey goes into this deployment's vault ...
    deployment = Deployment(parameters={"signingKeySecretUri": ""})
    _secure_parameter(deployment.main, "signingKey")
    vault = next(unit for unit in deployment.units if unit.path.name == "signing-vault.bicep")
    assert _secure_parameter(vault, "signingKey")
    reference = bicep_facts.source_text(deployment.settings["MBRIDGE_SIGNING_KEY"])
    assert reference.startswith("@Microsoft.KeyVault(SecretUri=")
    # AND it names the secret's version, as the Terraform's does: a new key is a new version, so the
    # setting changes and the app restarts onto it; a reference without a version is refreshed only
    # within 24 hours or at a restart, while the agents already verify with the new public key
    assert "signingVault.outputs.secretUriWithVersion" in reference
    vault_output = bicep_facts.render_node(vault, vault.section("outputs")["secretUriWithVersion"]["value"])
    assert vault_output.endswith("properties.secretUriWithVersion"), vault_output
    # ... whose one secret the function identity alone may read
    readers = [a for a in deployment.assignments() if deployment.role_of(a) == "Key Vault Secrets User"]
    assert [(deployment.principal_of(a), deployment.scope_of(a)) for a in readers] == [(FUNCTION, SCOPE_SIGNING_SECRET)]
    # GIVEN a secret URI THEN a Key Vault reference to it, and no vault of this deployment's
    uri = "https://kv.vault.azure.net/secrets/mbridge-signing"
    deployment = Deployment(parameters={"signingKeySecretUri": uri})
    reference = bicep_facts.source_text(deployment.settings["MBRIDGE_SIGNING_KEY"])
    assert reference.startswith("@Microsoft.KeyVault(SecretUri=")
    assert "signingKeySecretUri" in reference
    assert not [a for a in deployment.assignments() if deployment.role_of(a) == "Key Vault Secrets User"]
    # AND either way the platform resolves it with the function identity
    reference_identity = deployment.site.get("properties", "keyVaultReferenceIdentity")
    assert isinstance(reference_identity, Ref)
    assert Ref(reference_identity.unit, reference_identity.symbol) == deployment.function_identity()


def test_a_deployment_without_a_signing_key_fails(deployment: Deployment) -> None:
    # GIVEN the signing vault module, deployed unless signingKeySecretUri is given: the key comes
    # from a secure parameter that must not be empty, so neither signingKey nor signingKeySecretUri
    # given fails the deployment (the agents would refuse every unsigned command)
    vault = next(unit for unit in deployment.units if unit.path.name == "signing-vault.bicep")
    parameter = _secure_parameter(vault, "signingKey")
    assert {"type": "min_length", "argument": 1} in parameter["decorators"]
    assert parameter.get("default") is None
    # AND the parameters file never carries the private key
    assert "signingKey" not in json.loads(PARAMETERS_FILE.read_text(encoding="utf-8"))["parameters"]


def test_reader_goes_to_each_trust_resource_group_and_into_the_setting() -> None:
    # GIVEN two resource groups of VMs
    deployment = Deployment(parameters={"trustResourceGroups": ["rg-web", "rg-batch"]})
    readers = [a for a in deployment.assignments() if deployment.role_of(a) == "Reader"]
    # THEN the function identity gets Reader in each, deployed into that group
    assert sorted(render(deployment.resource_group_of(a.unit)) for a in readers) == ["rg-batch", "rg-web"]
    assert all(deployment.principal_of(a) == FUNCTION for a in readers)
    assert all("scope" not in a.config for a in readers)  # the resource group it is deployed into
    # AND the function app is told to look there
    array = deployment.trust_resource_groups_array()
    assert array is not None
    assert [value_of(item) for item in bicep_facts.array_items(array)] == ["rg-web", "rg-batch"]
    # GIVEN none THEN this resource group
    deployment = Deployment(parameters={"trustResourceGroups": []})
    [reader] = [a for a in deployment.assignments() if deployment.role_of(a) == "Reader"]
    assert render(deployment.resource_group_of(reader.unit)) == "resourceGroup().name"


def test_trusted_subscriptions_are_the_given_ones_or_this_one() -> None:
    subscriptions = ["11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"]
    for given, expected in (([], ["subscription().subscriptionId"]), (subscriptions, subscriptions)):
        array = Deployment(parameters={"trustSubscriptions": given}).joined_array("MBRIDGE_TRUST_SUBSCRIPTIONS")
        assert array is not None
        assert [render(item) for item in bicep_facts.array_items(array)] == expected


def test_function_app_deploys_its_package_with_its_identity(deployment: Deployment) -> None:
    # GIVEN the Flex Consumption configuration THEN the package comes from a blob container,
    # read with the function identity, and the app scales as designed
    storage = ("properties", "functionAppConfig", "deployment", "storage")
    site = deployment.site
    assert site.value(*storage, "type") == "blobContainer"
    assert site.value(*storage, "authentication", "type") == "UserAssignedIdentity"
    identity = site.get(*storage, "authentication", "userAssignedIdentityResourceId")
    assert isinstance(identity, Ref)
    assert Ref(identity.unit, identity.symbol) == deployment.function_identity()
    # AND that container is the one the storage module creates, closed to anonymous reads
    [container] = deployment.resources("Microsoft.Storage/storageAccounts/blobServices/containers")
    location = bicep_facts.source_text(site.get(*storage, "value"))
    assert location == "${storageAccount.properties.primaryEndpoints.blob}" + str(container.name)
    assert container.value("properties", "publicAccess") == "None"
    scale = ("properties", "functionAppConfig", "scaleAndConcurrency")
    assert value_of(site.get(*scale, "instanceMemoryMB")) == 2048
    assert value_of(site.get(*scale, "maximumInstanceCount")) == 40


# --- the example scale set -----------------------------------------------------------------


def _scale_set(deployment: Deployment) -> Resource:
    return deployment.one(SCALE_SET)


def test_example_scale_set_is_deployed_only_when_asked() -> None:
    # GIVEN deployExampleScaleSet false THEN no scale set; true THEN one
    assert Deployment(parameters={"deployExampleScaleSet": False}).resources(SCALE_SET) == []
    assert len(Deployment(parameters={"deployExampleScaleSet": True}).resources(SCALE_SET)) == 1
    # AND left to whoever deploys, the declaration depends on the parameter
    unit = next(unit for unit in Deployment().units if unit.path.name == "vmss-example.bicep")
    assert unit.caller is not None
    assert truth(unit.caller, unit.condition) is None


def test_cloud_init_placeholders_are_all_replaced(deployment: Deployment) -> None:
    # GIVEN the scale set's custom data
    built = custom_data(_scale_set(deployment))
    assert built is not None
    assert built.template == (AGENT_INSTALL / "cloud-init.yaml").resolve()
    # WHEN the quoted placeholders of cloud-init.yaml are compared with the replaced ones
    template = built.template.read_text(encoding="utf-8")
    in_file = set(re.findall(r'"(@@[A-Z0-9_]+@@)"', template))
    replaced = {old.strip('"') for old in built.replacements}
    # THEN each is replaced, as a whole quoted YAML string (never inside a comment)
    assert in_file == replaced == PLACEHOLDERS
    assert all(old.startswith('"') and old.endswith('"') for old in built.replacements)
    # AND the files loaded for them exist: Bicep reads them when it builds the template
    for old, new in built.replacements.items():
        unit, function = _function(new)
        assert function["type"] == "format", old
        assert value_of(_argument(unit, function, "format_string")) == '"{0}"', old
        inner_unit, inner = _function(_argument(unit, function, "arg_1"))
        if inner["type"] == "load_file_as_base64":
            loaded = (inner_unit.path.parent / inner["parameters"]["file_path"]).resolve()
            assert loaded.is_file(), loaded
            assert loaded.name == {'"@@AGENT_UNIT_B64@@"': "mbridge-agent.service"}.get(old, "install-agent.sh"), old
        else:
            assert inner["type"] == "base64", old


def _environment_lines(deployment: Deployment) -> dict[str, Resolved]:
    """KEY -> value of the agent's environment file as the scale set module builds it."""
    built = custom_data(_scale_set(deployment))
    assert built is not None
    unit, function = _function(built.replacements['"@@AGENT_ENV_B64@@"'])
    unit, encoded = _function(_argument(unit, function, "arg_1"))
    unit, joined = _function(_argument(unit, encoded, "input_string"))
    assert joined["type"] == "join"
    assert value_of(_argument(unit, joined, "delimiter")) == "\n"
    lines = _argument(unit, joined, "input_array")
    assert isinstance(lines, Lit)
    *settings, last = lines.node
    assert last == "", "the file ends with a newline"
    found: dict[str, Resolved] = {}
    for line in settings:
        key, _, value = line.partition("=")
        if re.fullmatch(r"\$\{\w+\}", value):
            found[key] = resolve_symbol(lines.unit, value[2:-1])
        else:
            found[key] = _evaluate(resolve(lines.unit, value))
    return found


def test_agent_environment_sets_what_the_agent_reads(deployment: Deployment) -> None:
    # GIVEN the agent's environment file as the scale set module writes it
    environment = _environment_lines(deployment)
    assert set(environment) == AGENT_ENVIRONMENT_KEYS
    # THEN every key is a setting the agent (or azure-identity, for AZURE_CLIENT_ID) reads
    agent_source = " ".join(path.read_text(encoding="utf-8") for path in (REPO_ROOT / "agent").rglob("*.py"))
    for key in AGENT_ENVIRONMENT_KEYS - {"AZURE_CLIENT_ID"}:
        assert f'"{key}"' in agent_source, key
    assert environment["MBRIDGE_CLOUD"] == "azure"
    assert environment["MBRIDGE_TRANSPORT"] == "servicebus"
    # AND it names the function app's namespace, the agents' own identity, the probed port
    assert (
        environment["MBRIDGE_SERVICEBUS_NAMESPACE"]
        == deployment.settings["MBRIDGE_SERVICEBUS__fullyQualifiedNamespace"]
    )
    agent = deployment.agent_identity()
    assert environment["AZURE_CLIENT_ID"] == Ref(agent.unit, agent.symbol, ("properties", "clientId"))
    assert environment["MBRIDGE_LISTEN"] == f"0.0.0.0:{bicep_facts.read().vmss_health_probe_port}"
    # AND the public key of the signing key, which the scale set module requires: its agents would
    # not start without one
    verify_key = environment["MBRIDGE_VERIFY_KEY"]
    assert isinstance(verify_key, ParamRef)
    assert verify_key.name == "agentVerifyKey"
    module = next(unit for unit in deployment.units if unit.path.name == "vmss-example.bicep")
    decorators = module.section("parameters")["agentVerifyKey"]["decorators"]
    assert {"type": "min_length", "argument": 1} in decorators
    # AND the count of commands queues, from which each agent derives its own (wire/shards.py)
    assert environment["MBRIDGE_COMMANDS_SHARDS"] == 1
    sharded = _environment_lines(Deployment(parameters={"commandsMode": "queue", "commandsShards": 3}))
    assert sharded["MBRIDGE_COMMANDS_SHARDS"] == 3


def _evaluate(resolved: Resolved) -> str:
    """The text a deployment would compute, with a 64-character stand-in for what Azure decides."""
    resolved = deref(resolved)
    if isinstance(resolved, (str, int)) and not isinstance(resolved, bool):
        return str(resolved)
    if isinstance(resolved, ParamRef):
        return _evaluate(value_of(resolved))
    if isinstance(resolved, (Ref, Choice)):
        return "x" * 64
    assert isinstance(resolved, Expr), render(resolved)
    unit, node = resolved.unit, resolved.node
    if isinstance(node, str):  # a string with interpolations: literal parts unescaped, the rest evaluated
        parts = re.split(r"\$\{([^{}]*)\}", node)
        return "".join(
            _evaluate(resolve_symbol(unit, *_chain(part))) if odd else bicep_facts.unescape(part)
            for odd, part in zip(itertools.cycle((False, True)), parts)
        )
    function = node["function"]
    arguments = [resolve(unit, value) for value in function["parameters"].values() if value is not None]
    kind = function["type"]
    if kind in COMPUTED_BY_AZURE:
        return "x" * 64
    if kind == "base64":
        return base64.b64encode(_evaluate(arguments[0]).encode()).decode()
    if kind == "load_file_as_base64":
        return base64.b64encode((unit.path.parent / str(arguments[0])).read_bytes()).decode()
    if kind == "load_text_content":
        return (unit.path.parent / str(arguments[0])).read_text(encoding="utf-8")
    if kind == "replace":
        return _evaluate(arguments[0]).replace(_evaluate(arguments[1]), _evaluate(arguments[2]))
    if kind == "format":
        return _evaluate(arguments[0]).format(*(_evaluate(a) for a in arguments[1:]))
    if kind == "string":
        return _evaluate(arguments[0])
    if kind == "join":
        assert isinstance(arguments[0], Lit)
        return _evaluate(arguments[1]).join(_evaluate(resolve(unit, item)) for item in arguments[0].node)
    raise AssertionError(f"cannot evaluate {kind}()")


def _chain(text: str) -> tuple[str, tuple[str, ...]]:
    head, *names = text.strip().split(".")
    return head, tuple(names)


def test_custom_data_is_valid_cloud_config_within_the_azure_limit(deployment: Deployment) -> None:
    # GIVEN the custom data as a deployment computes it (stand-ins for ids and endpoints)
    scale_set = _scale_set(deployment)
    encoded = _evaluate(scale_set.get("properties", "virtualMachineProfile", "osProfile", "customData"))
    # THEN it fits Azure's limit
    assert len(encoded) <= CUSTOM_DATA_LIMIT, len(encoded)
    # AND it is the cloud-config with every file embedded as it is on disk
    text = base64.b64decode(encoded).decode()
    assert text.startswith("#cloud-config")
    assert not re.search(r'"@@[A-Z0-9_]+@@"', text)
    contents = [base64.b64decode(value) for value in re.findall(r'content: "([A-Za-z0-9+/=]+)"', text)]
    assert (AGENT_INSTALL / "mbridge-agent.service").read_bytes() in contents
    assert (AGENT_INSTALL / "install-agent.sh").read_bytes() in contents
    assert f"MBRIDGE_PACKAGE={bicep_facts.EXAMPLE_AGENT_PACKAGE}\n".encode() in contents
    environment = next(c for c in contents if c.startswith(b"MBRIDGE_CLOUD=azure\n"))
    assert b"\nMBRIDGE_VERIFY_KEY=\n" in environment
    assert environment.endswith(b"\nMBRIDGE_COMMANDS_SHARDS=1\n")


def test_load_balancer_probe_reaches_the_agent_port_only(deployment: Deployment) -> None:
    # GIVEN the network security group of the scale set's subnet
    [group] = deployment.resources("Microsoft.Network/networkSecurityGroups")
    rules = group.get("properties", "securityRules")
    assert isinstance(rules, Lit)

    def field(rule: Any, name: str) -> str:
        return _evaluate(resolve(rules.unit, rule, ("properties", name)))

    from_load_balancer = [rule for rule in rules.node if field(rule, "sourceAddressPrefix") == "AzureLoadBalancer"]
    allows = [rule for rule in from_load_balancer if field(rule, "access") == "Allow"]
    denies = [rule for rule in from_load_balancer if field(rule, "access") == "Deny"]
    # THEN the probe source may reach the agent's port and nothing else
    [allow], [deny] = allows, denies
    assert (field(allow, "direction"), field(allow, "protocol")) == ("Inbound", "Tcp")
    assert field(allow, "destinationPortRange") == str(bicep_facts.read().vmss_health_probe_port)
    assert (field(deny, "direction"), field(deny, "destinationPortRange")) == ("Inbound", "*")
    # AND the deny comes after the allow and before the platform's AllowAzureLoadBalancerInBound (65001)
    assert int(field(allow, "priority")) < int(field(deny, "priority")) < 65000
    # AND the subnet of the scale set uses that group
    [network] = deployment.resources(bicep_facts.VIRTUAL_NETWORK)
    [subnet] = value_of(network.get("properties", "subnets"))
    assert subnet["properties"]["networkSecurityGroup"]["id"] == f"{group.symbol}.id"


def test_scale_set_has_no_public_ip_and_no_password(deployment: Deployment) -> None:
    # GIVEN the example scale set THEN its VMs have no public IP and take SSH keys only,
    # run Ubuntu 22.04 LTS in Uniform orchestration, behind a Standard internal load balancer
    scale_set = _scale_set(deployment)
    profile = value_of(scale_set.get("properties", "virtualMachineProfile"))
    for nic in profile["networkProfile"]["networkInterfaceConfigurations"]:
        for ip_configuration in nic["properties"]["ipConfigurations"]:
            assert "publicIPAddressConfiguration" not in ip_configuration["properties"]
    linux = profile["osProfile"]["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True
    assert "adminPassword" not in profile["osProfile"]
    image = profile["storageProfile"]["imageReference"]
    assert (image["publisher"], image["offer"], image["sku"]) == (
        "Canonical",
        "0001-com-ubuntu-server-jammy",
        "22_04-lts-gen2",
    )
    assert scale_set.value("properties", "orchestrationMode") == "Uniform"
    # AND the load balancer has no public frontend
    [balancer] = deployment.resources(LOAD_BALANCER)
    assert balancer.value("sku", "name") == "Standard"
    for frontend in value_of(balancer.get("properties", "frontendIPConfigurations")):
        assert "publicIPAddress" not in frontend["properties"]


def test_outputs_name_the_deployed_values(deployment: Deployment) -> None:
    # GIVEN main.bicep's outputs THEN each is the value of the resource it names (the agents'
    # identity, not the function's; the endpoints the function app uses)
    outputs = deployment.main.section("outputs")

    def output(name: str) -> Resolved:
        return resolve(deployment.main, outputs[name]["value"])

    agent = deployment.agent_identity()
    assert output("agentIdentityClientId") == Ref(agent.unit, agent.symbol, ("properties", "clientId"))
    assert agent != deployment.function_identity()
    assert output("eventsTopic") == deployment.events_topic().get("name")
    assert output("commandsQueue") == deployment.commands_queue().get("name")
    assert output("auditTable") == deployment.audit_table().get("name")
    assert output("servicebusNamespaceFqdn") == deployment.settings["MBRIDGE_SERVICEBUS__fullyQualifiedNamespace"]
    storage = deployment.storage_account()
    assert output("tableEndpoint") == Ref(storage.unit, storage.symbol, ("properties", "primaryEndpoints", "table"))
    assert render(output("functionAppName")) == render(deployment.site.get("name"))


# --- the isolated (topic) mode -------------------------------------------------------------


def test_a_vm_gets_its_receiver_role_only_once_its_filter_is_in_place(topic_deployment: Deployment) -> None:
    # GIVEN each VM's subscription, its `$Default` rule (rewritten with the VM's filter) and its
    # receiver role
    for subscription in topic_deployment.commands_subscriptions():
        unit = subscription.unit
        [rule] = [
            r
            for r in topic_deployment.resources(bicep_facts.RULE)
            if r.unit is unit and r.get("parent") == Ref(unit, subscription.symbol)
        ]
        [receiver] = [
            a
            for a in topic_deployment.assignments()
            if a.unit is unit and a.get("scope") == Ref(unit, subscription.symbol)
        ]
        # THEN the role waits for the filter: until then `$Default` passed every VM's commands
        assert rule.name == "$Default"
        assert receiver.config.get("dependsOn") == [rule.symbol]


def test_the_per_vm_module_is_called_for_each_vm_in_the_topic_mode_only() -> None:
    # GIVEN VMs listed in the queue mode THEN no subscription is made for them
    vms = [{"name": "web-0", "principalId": "11111111-1111-4111-8111-111111111111"}]
    queue = Deployment(parameters={"commandsMode": "queue", "commandsSubscriptionVms": vms})
    assert [s for s in queue.resources(bicep_facts.SUBSCRIPTION) if "vm-" in str(s.name)] == []
    # AND the module names the subscription after the VM, within the 50 characters Service Bus takes
    module = next(unit for unit in queue.units if unit.path.name == "vm-commands-subscription.bicep")
    limits = {d["type"]: d["argument"] for d in module.section("parameters")["vmName"]["decorators"]}
    assert len("vm-") + limits["max_length"] == 50


def test_the_commands_quota_check_names_each_quota() -> None:
    # GIVEN main.bicep's quota check (its arithmetic is not evaluated by tests/infra: bicep_facts
    # has no integer arithmetic nor filter())
    text = (BICEP_DIR / "main.bicep").read_text(encoding="utf-8")
    # THEN it feeds modules/check.bicep before the namespace, with the quotas' numbers and the page
    assert "module commandsQuotaCheck 'modules/check.bicep'" in text
    assert "https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas" in text
    for line in (
        "var serviceBusSubscriptionsPerTopic = 2000",
        "var serviceBusReceivesPerEntity = 5000",
        "var serviceBusConnectionsPerNamespace = 5000",
        "var peakEngagedTenths = 3",
    ):
        assert line in text, line
    for message in (
        "subscriptions per topic",
        "concurrent receive requests per queue or topic",
        "split the fleet over several deployments, each in its own resource group",
        "Service Bus Standard allows 1000 credits a second per namespace",
        "Drain through /readyz instead",
        "the queue mode would let each of them read or take the others",
        "Resource Manager deploys at most 800 resources per template",
    ):
        assert message in text, message
    assert "https://learn.microsoft.com/azure/service-bus-messaging/service-bus-throttling" in text
    # AND shards are deployed, not refused
    assert "one commands entity only" not in text


# --- commands shards -----------------------------------------------------------------------

SENDER = "Azure Service Bus Data Sender"
RECEIVER = "Azure Service Bus Data Receiver"
WEB_0 = {"name": "web-0", "principalId": "11111111-1111-4111-8111-111111111111"}
DB_1 = {"name": "db-1", "principalId": "22222222-2222-4222-8222-222222222222"}


def _sharded(mode: str, shards: int, vms: list[dict[str, str]] | None = None) -> Deployment:
    parameters: dict[str, Any] = {"commandsMode": mode, "commandsShards": shards, "drainLoadBalancerName": ""}
    if vms is not None:
        parameters["commandsSubscriptionVms"] = vms
    return Deployment(parameters=parameters)


def _with_topics(vms: list[dict[str, str]], shards: int) -> list[dict[str, str]]:
    """Each VM with the topic of its shard, as `mbridge commands-entity --vm NAME --shards N` prints it."""
    return [{**vm, "topic": entity_for("maintenance-commands", vm["name"], shards)} for vm in vms]


def _commands_scope(mode: str, shard: int) -> str:
    return commands_entity_scope(SCOPE_COMMANDS_TOPIC if mode == "topic" else SCOPE_COMMANDS_QUEUE, shard)


@pytest.mark.parametrize("mode", ["queue", "topic"])
@pytest.mark.parametrize("shards", [1, 3])
def test_each_shard_has_a_commands_entity_with_the_settings_of_the_single_one(mode: str, shards: int) -> None:
    # GIVEN the deployment with one commands entity, and with `shards` of them
    single = _sharded(mode, 1).commands_entities()
    entities = _sharded(mode, shards).commands_entities()
    # THEN shard k is `maintenance-commands` for k = 0, `maintenance-commands-<k>` else (wire/shards.py)
    assert list(entities) == list(range(shards))
    names = [entity.name for entity in entities.values()]
    assert names == [sharded_name("maintenance-commands", shard, shards) for shard in range(shards)]
    # AND each is the single entity's kind with its settings: the queue's sessions, lock, lifetime
    # and duplicate detection, or the topic's
    expected = single[0].value("properties")
    assert {entity.type for entity in entities.values()} == {TOPIC if mode == "topic" else QUEUE}
    for entity in entities.values():
        assert entity.value("properties") == expected, entity.name
    assert expected["requiresDuplicateDetection"] is True
    assert expected["defaultMessageTimeToLive"] == "PT10M"
    if mode == "queue":
        assert expected["requiresSession"] is True
    # AND no entity of the other kind is deployed
    other = QUEUE if mode == "topic" else TOPIC
    assert [r.name for r in _sharded(mode, shards).resources(other) if "commands" in str(r.name)] == []


@pytest.mark.parametrize("shards", [1, 3])
def test_in_the_queue_mode_each_shard_queue_is_sent_to_by_the_functions_and_read_by_the_agents(shards: int) -> None:
    # GIVEN the queue mode with `shards` queues, and with one
    deployment = _sharded("queue", shards)
    grants = set(deployment.grants())
    single = set(_sharded("queue", 1).grants())
    # THEN on each shard queue the functions hold Data Sender and the agents' identity Data Receiver
    on_queues = {
        grant
        for shard in range(shards)
        for grant in (
            RoleGrant(FUNCTION, SENDER, _commands_scope("queue", shard)),
            RoleGrant(AGENT, RECEIVER, _commands_scope("queue", shard)),
        )
    }
    assert {grant for grant in grants if grant.scope.startswith(SCOPE_COMMANDS_QUEUE)} == on_queues
    # AND everything else is what a single queue's deployment grants: nothing broader appears
    assert grants - on_queues == {grant for grant in single if not grant.scope.startswith(SCOPE_COMMANDS_QUEUE)}
    # AND each assignment is guid(its queue's id, principal, role) with the built-in role's id
    assert len(deployment.assignments()) == len(_sharded("queue", 1).assignments()) - 2 + 2 * shards
    assert_guid_names(deployment.assignments())


@pytest.mark.parametrize("shards", [1, 3])
def test_in_the_topic_mode_each_shard_topic_is_sent_to_by_the_functions_and_each_vm_reads_its_own(
    shards: int,
) -> None:
    # GIVEN the topic mode with `shards` topics and two VMs, each given its shard's topic
    vms = _with_topics([WEB_0, DB_1], shards)
    deployment = _sharded("topic", shards, vms)
    assert bicep_facts.refusal(deployment) == ""
    grants = set(deployment.grants())
    # THEN the functions hold Data Sender on each shard topic, and no agent identity anything on one
    on_topics = {RoleGrant(FUNCTION, SENDER, _commands_scope("topic", shard)) for shard in range(shards)}
    assert {
        grant for grant in grants if grant.scope in {_commands_scope("topic", k) for k in range(shards)}
    } == on_topics
    # AND each VM's own identity receives from its subscription on its shard's topic, and nothing else
    # of the commands
    for vm in vms:
        shard = shard_of(vm["name"], shards)
        mine = {grant for grant in grants if grant.principal == vm_principal(vm["principalId"])}
        assert mine == {
            RoleGrant(
                vm_principal(vm["principalId"]), RECEIVER, commands_subscription_scope(f"vm-{vm['name']}", shard)
            ),
            RoleGrant(vm_principal(vm["principalId"]), SENDER, SCOPE_EVENTS_TOPIC),
        }
    subscriptions = {
        str(s.name): bicep_facts.vm_subscription(deployment, s) for s in deployment.commands_subscriptions()
    }
    assert {name: s.topic for name, s in subscriptions.items()} == {f"vm-{vm['name']}": vm["topic"] for vm in vms}
    # AND apart from the topics and the VMs, the grants are those of a single topic's deployment
    single = set(_sharded("topic", 1, []).grants())
    vm_principals = {vm_principal(vm["principalId"]) for vm in vms}
    rest = {grant for grant in grants if grant not in on_topics and grant.principal not in vm_principals}
    assert rest == single - {RoleGrant(FUNCTION, SENDER, SCOPE_COMMANDS_TOPIC)}
    assert_guid_names(deployment.assignments())


@pytest.mark.parametrize("mode", ["queue", "topic"])
@pytest.mark.parametrize("shards", [1, 3])
def test_outputs_and_settings_name_every_shard(mode: str, shards: int) -> None:
    # GIVEN the deployment with `shards` commands entities
    deployment = _sharded(mode, shards, [])
    outputs = deployment.main.section("outputs")

    def output(name: str) -> Any:
        return value_of(resolve(deployment.main, outputs[name]["value"]))

    names = [sharded_name("maintenance-commands", shard, shards) for shard in range(shards)]
    # THEN commandsEntities lists every entity, shard 0 first
    assert output("commandsEntities") == names
    # AND commandsQueue / commandsTopic stay shard 0's, the base name the agents and functions take
    assert (output("commandsQueue"), output("commandsTopic")) == (("", names[0]) if mode == "topic" else (names[0], ""))
    settings = deployment.settings
    assert value_of(settings["MBRIDGE_COMMANDS_TOPIC" if mode == "topic" else "MBRIDGE_COMMANDS_QUEUE"]) == names[0]
    # AND the function app is told the count, from which it derives each VM's entity
    assert _evaluate(settings["MBRIDGE_COMMANDS_SHARDS"]) == str(shards)
    assert value_of(settings["MBRIDGE_COMMANDS_MODE"]) == mode


def test_with_several_shards_each_vm_needs_its_shard_topic() -> None:
    # GIVEN one shard: a VM without a topic gets its subscription on the one topic
    one = _sharded("topic", 1, [WEB_0])
    [subscription] = one.commands_subscriptions()
    assert bicep_facts.refusal(one) == ""
    assert one.resource_of(subscription.get("parent")).name == "maintenance-commands"
    # WHEN there are 3 shards and a VM gives no topic (Bicep cannot compute its shard)
    refusal = bicep_facts.refusal(_sharded("topic", 3, [WEB_0, *_with_topics([DB_1], 3)]))
    # THEN the deployment stops, naming the VM and the command that prints its topic
    assert refusal.startswith("commandsSubscriptionVms: web-0 has no topic; with commandsShards = 3,")
    assert "`mbridge commands-entity --vm web-0 --shards 3`" in refusal
    assert "db-1" not in refusal
    # AND so does a topic that is none of the deployment's
    refusal = bicep_facts.refusal(_sharded("topic", 3, [{**WEB_0, "topic": "maintenance-commands-3"}]))
    assert refusal.startswith(
        "commandsSubscriptionVms: the topic of web-0, 'maintenance-commands-3', is not one of the 3 commands topics"
    )
    # AND the check runs before the namespace, in the topic mode only
    check = _sharded("topic", 3).main.section("modules")["commandsTopicsCheck"]
    assert check["detail"]["path"] == "modules/check.bicep"
    assert "commandsTopicsCheck" in _sharded("topic", 3).main.section("modules")["serviceBus"]["config"]["dependsOn"]
    assert bicep_facts.refusal(_sharded("queue", 3, [WEB_0])) == ""
