"""The Terraform of the Azure deployment (infra/terraform/azure/), beyond the shared contract.

GIVEN the module parsed with python-hcl2 (the parser checkov uses), and the code it deploys
WHEN  it is compared with the module conventions, the setting and variable names the code reads,
      and the provider gaps it works around
THEN  it is pinned, documented, key-free, and wired to exactly what the function app and the
      agent read.

test_azure_contract.py holds what the Bicep and the Terraform must both deploy; this file holds
what only the Terraform can get wrong. Where the code defines a fact (setting names, environment
variable names, table names), the test reads it from the code.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml

from functions.azure_app import settings as app_settings
from tests.infra import console, terraform_azure_facts
from tests.infra.azure_facts import AzureFacts
from tests.infra.sources import (
    AGENT_INSTALL,
    TERRAFORM_AZURE,
    assert_agent_package_is_pinned,
    load_terraform,
    terraform_outputs,
    terraform_resources,
    terraform_variables,
)

Body = dict[str, Any]

FUNCTION_APP = "azurerm_function_app_flex_consumption.this"
APP_SETTINGS_PUT = "azapi_resource_action.function_app_settings"
DEFAULT_RULE_DELETE = "azapi_resource_action.remove_operator_results_default_rule"
SCALE_SET = "azurerm_linux_virtual_machine_scale_set.agents"
VM_COMMANDS_MODULE = TERRAFORM_AZURE / "modules" / "vm_commands_subscription"
# The root's role assignments of one commands mode only.
COMMANDS_MODE_ASSIGNMENTS = {
    "queue": ("azurerm_role_assignment.function_sends_commands", "azurerm_role_assignment.agent_receives_commands"),
    "topic": ("azurerm_role_assignment.function_sends_commands_to_topic",),
}
# Attributes that carry a key or a key-based connection string.
KEY_ATTRIBUTE = re.compile(
    r"\.(?:\w+_connection_string|(?:default_)?(?:primary|secondary)(?:_access)?_key|\w*access_key|\w*sas\w*)\b"
)
KEY_ARGUMENTS = {"storage_access_key", "function_app_storage_account_access_key", "storage_account_access_key"}


# ---------------------------------------------------------------- reading the sources


@cache
def parsed() -> dict[str, list[Any]]:
    return load_terraform(TERRAFORM_AZURE)


def resources() -> dict[str, Body]:
    return terraform_resources(parsed())


def resource(address: str) -> Body:
    found = resources()
    assert address in found, f"{address} is not declared"
    return found[address]


def of_type(resource_type: str) -> dict[str, Body]:
    return {address: body for address, body in resources().items() if address.split(".")[0] == resource_type}


def block(body: Body, name: str) -> Body:
    """The one nested block `name` of a body (python-hcl2 gives blocks as lists)."""
    blocks = body.get(name)
    assert isinstance(blocks, list), f"{name} is not a block: {blocks!r}"
    assert len(blocks) == 1, f"expected exactly one {name} block, got {blocks!r}"
    found: Body = blocks[0]
    return found


def local(name: str) -> Any:
    values = {key: value for entry in parsed().get("locals", []) for key, value in entry.items()}
    assert name in values, f"local.{name} is not declared"
    return values[name]


def ref(address: str) -> str:
    """How python-hcl2 renders a bare reference: `${azurerm_servicebus_queue.commands.id}`."""
    return "${" + address + "}"


def strings(value: Any) -> Iterator[str]:
    """Every string anywhere in a parsed value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def keys(value: Any) -> Iterator[str]:
    """Every map key and argument name anywhere in a parsed value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from keys(item)


@cache
def facts() -> AzureFacts:
    return terraform_azure_facts.read()


def names_read_from_environment() -> set[str]:
    """Environment variable names the agent reads: those of its settings' one definition."""
    from agent.config import SETTINGS

    return {setting.env for setting in SETTINGS}


# ---------------------------------------------------------------- module conventions


def test_every_variable_has_a_description_and_a_type() -> None:
    # GIVEN every variable of the module
    variables = terraform_variables(parsed())
    assert variables
    # THEN each says what it is for and what it takes
    for name, body in variables.items():
        assert str(body.get("description", "")).strip(), f"var.{name} has no description"
        assert body.get("type"), f"var.{name} has no type"


def test_variables_with_rules_are_validated() -> None:
    # GIVEN the variables whose values Azure or the code constrain
    constrained = {
        "name_prefix",  # storage account and namespace names
        "servicebus_sku",  # Basic has no topics
        "events_duplicate_detection_window",  # >= 10 minutes
        "terminate_not_before_timeout",  # PT5M..PT15M
        "function_instance_memory_mb",
        "function_maximum_instance_count",
        "storage_replication_type",
        "admin_ssh_public_key",
        "agent_package",  # one line of an environment file
        "trust_resource_groups",  # resource group names, each once
        "trust_subscriptions",  # subscription ids
        "commands_mode",  # queue or topic
        "commands_subscription_vms",  # subscription names of 50 characters, principal ids
        "telemetry",  # off or azure-monitor
    }
    variables = terraform_variables(parsed())
    # THEN each has a validation with a condition and a message
    for name in constrained:
        validations = variables[name].get("validation", [])
        assert validations, f"var.{name} is not validated"
        for validation in validations:
            assert validation.get("condition"), name
            assert validation.get("error_message"), name


def test_name_prefix_validation_matches_the_names_built_from_it() -> None:
    # GIVEN the prefix rule and the suffix length
    condition = terraform_variables(parsed())["name_prefix"]["validation"][0]["condition"]
    pattern = re.search(r'regex\("([^"]+)"', condition)
    assert pattern
    suffix_length = int(resource("random_string.suffix")["length"])
    longest = re.fullmatch(r"\^\[a-z\]\[a-z0-9\]\{2,(\d+)\}\$", pattern.group(1).replace("\\\\", "\\"))
    assert longest, pattern.group(1)
    # THEN the longest storage account name (prefix + "st" + suffix) fits Azure's 24 characters
    assert 1 + int(longest.group(1)) + len("st") + suffix_length <= 24
    assert local("storage_account_name") == "${var.name_prefix}st${local.suffix}"


def test_providers_are_pinned_within_a_major_version() -> None:
    # GIVEN the terraform block
    terraform = parsed()["terraform"][0]
    assert terraform["required_version"] == ">= 1.6"
    providers = terraform["required_providers"][0]
    # THEN every provider has a source and a pessimistic `~> X.Y` constraint
    assert set(providers) == {"azurerm", "azapi", "random", "tls"}
    for name, spec in providers.items():
        assert spec.get("source"), name
        assert re.fullmatch(r"~> \d+\.\d+", spec["version"]), f"{name}: {spec['version']}"
    # AND azurerm is recent enough for the flex consumption app's https_only (4.31) but stays in 4.x
    major, minor = (int(part) for part in providers["azurerm"]["version"][3:].split("."))
    assert (major, minor) >= (4, 31)
    assert major == 4
    # AND tls can make Ed25519 keys and write them as PKCS#8 (4.0)
    assert providers["tls"]["source"] == "hashicorp/tls"
    assert int(providers["tls"]["version"][3:].split(".")[0]) == 4


def test_azurerm_reaches_storage_with_entra_id_through_resource_manager() -> None:
    # GIVEN the azurerm provider configuration
    azurerm = next(provider["azurerm"] for provider in parsed()["provider"] if "azurerm" in provider)
    # THEN storage data-plane calls use Entra ID (the account refuses shared keys) ...
    assert azurerm["storage_use_azuread"] is True
    # ... and the storage account is managed through ARM only
    storage = block(block(azurerm, "features"), "storage")
    assert storage["data_plane_available"] is False


def test_every_output_has_a_description() -> None:
    # GIVEN every output; THEN each says what it is for
    outputs = terraform_outputs(parsed())
    assert outputs
    for name, body in outputs.items():
        assert str(body.get("description", "")).strip(), f"output {name} has no description"


def test_every_resource_that_takes_tags_is_tagged() -> None:
    # GIVEN the resources whose azurerm schema has `tags` (the ones that are not sub-resources)
    taggable = (
        "azurerm_user_assigned_identity",
        "azurerm_log_analytics_workspace",
        "azurerm_application_insights",
        "azurerm_storage_account",
        "azurerm_servicebus_namespace",
        "azurerm_service_plan",
        "azurerm_function_app_flex_consumption",
        "azurerm_virtual_network",
        "azurerm_network_security_group",
        "azurerm_public_ip",
        "azurerm_nat_gateway",
        "azurerm_lb",
        "azurerm_linux_virtual_machine_scale_set",
    )
    found = [address for address in resources() if address.split(".")[0] in taggable]
    assert len(found) == len(taggable) + 1  # two identities
    # THEN each carries var.tags
    for address in found:
        assert resources()[address].get("tags") == "${var.tags}", address


# ---------------------------------------------------------------- no keys anywhere


def test_no_key_or_key_based_connection_string_is_referenced() -> None:
    # GIVEN every value and every argument of every block of the module
    everything = list(strings(parsed()))
    arguments = set(keys(parsed()))
    # THEN no attribute holding a key, a SAS or a key-based connection string is read ...
    offending = sorted({match.group(0) for text in everything for match in KEY_ATTRIBUTE.finditer(text)})
    assert not offending, offending
    # ... no argument passes a key ...
    assert not arguments & KEY_ARGUMENTS
    # ... and no literal key-based connection string is written
    for text in everything:
        assert "AccountKey=" not in text, text
        assert "SharedAccessKey" not in text, text


def test_the_key_regex_catches_what_it_must() -> None:
    # GIVEN references that would leak a key, and ones that do not
    leaking = [
        "${azurerm_storage_account.this.primary_connection_string}",
        "${azurerm_storage_account.this.primary_access_key}",
        "${azurerm_servicebus_namespace.this.default_primary_key}",
        "${azurerm_servicebus_namespace_authorization_rule.x.primary_connection_string}",
    ]
    harmless = [
        "${azurerm_application_insights.this.connection_string}",  # no key (local auth is disabled)
        "${azurerm_storage_account.this.primary_table_endpoint}",
        "${azurerm_user_assigned_identity.function.client_id}",
    ]
    # THEN the check above flags exactly the leaking ones
    assert all(KEY_ATTRIBUTE.search(text) for text in leaking)
    assert not any(KEY_ATTRIBUTE.search(text) for text in harmless)


def test_storage_account_refuses_shared_keys_and_plain_http() -> None:
    # GIVEN the one storage account; THEN it takes Entra ID over TLS 1.2 only, with no anonymous
    # blobs and no local (SFTP) users
    account = resource("azurerm_storage_account.this")
    assert account["shared_access_key_enabled"] is False
    assert account["https_traffic_only_enabled"] is True
    assert account["allow_nested_items_to_be_public"] is False
    assert account["local_user_enabled"] is False
    assert account["min_tls_version"] == "TLS1_2"


# ---------------------------------------------------------------- the app settings


def test_commands_are_signed_with_a_generated_key_whose_public_key_the_agents_get() -> None:
    # GIVEN the generated key pair
    key = resource("tls_private_key.commands")
    assert key["algorithm"] == "ED25519"
    assert "count" not in key  # always: the agents run no unsigned command
    # THEN the app signs with the private key (one line, signing.tf), from its PKCS#8 form, kept
    # as a Key Vault secret the setting refers to ...
    assert local("function_app_settings")[app_settings.SIGNING_KEY] == "${local.signing_key_reference}"
    secret = resource("azapi_resource.signing_key")
    assert secret["type"].startswith("Microsoft.KeyVault/vaults/secrets@")
    assert secret["body"]["properties"]["value"] == "${local.signing_key}"
    assert "tls_private_key.commands.private_key_pem_pkcs8" in local("signing_key_der")
    # ... and the agents verify with its public key, in the example and in the output for other VMs
    assert local("agent_environment")["MBRIDGE_VERIFY_KEY"] == "${local.verify_key}"
    assert "tls_private_key.commands.public_key_pem" in local("verify_key")
    assert terraform_outputs(parsed())["agent_verify_key"]["value"] == "${local.verify_key}"
    assert "MBRIDGE_INSECURE_UNSIGNED_COMMANDS" not in local("agent_environment")


def test_the_signing_key_reference_resolves_with_the_function_identity_after_its_grant() -> None:
    # GIVEN the setting: a reference to the secret in the deployment's vault, with its version, so
    # that a new key changes the setting and the app restarts onto it
    reference = local("signing_key_reference")
    assert reference == (
        "@Microsoft.KeyVault(SecretUri=${azapi_resource.signing_key.output.properties.secretUriWithVersion})"
    )
    assert resource("azapi_resource.signing_key")["response_export_values"] == ["properties.secretUriWithVersion"]
    assert resource("azapi_resource.signing_key")["parent_id"] == "${azurerm_key_vault.signing.id}"
    # AND a vault of Azure RBAC only (no access policies to widen it)
    vault = resource("azurerm_key_vault.signing")
    assert vault["rbac_authorization_enabled"] is True
    assert "access_policy" not in vault
    # WHEN the app resolves it THEN with its user-assigned identity, the one that may read the secret
    # (the site's keyVaultReferenceIdentity, set again whenever the provider rewrites the app)
    identity = resource("azapi_resource_action.function_key_vault_identity")
    assert identity["method"] == "PATCH"
    assert identity["resource_id"] == "${azurerm_function_app_flex_consumption.this.id}"
    assert identity["body"]["properties"] == {
        "keyVaultReferenceIdentity": "${azurerm_user_assigned_identity.function.id}"
    }
    assert identity["lifecycle"][0]["replace_triggered_by"] == ["${azurerm_function_app_flex_consumption.this}"]
    grant = resource("azurerm_role_assignment.function_reads_signing_key")
    assert grant["principal_id"] == "${azurerm_user_assigned_identity.function.principal_id}"
    assert grant["scope"] == "${azapi_resource.signing_key.id}"
    # AND the settings PUT, which restarts the app and so resolves the reference again, comes after both
    assert set(resource(APP_SETTINGS_PUT)["depends_on"]) == {
        "${azurerm_role_assignment.function_reads_signing_key}",
        "${azapi_resource_action.function_key_vault_identity}",
    }


def test_reader_is_assigned_on_each_trust_resource_group() -> None:
    # GIVEN the Reader assignment of the VM directory
    reader = resource("azurerm_role_assignment.function_reads_vms")
    # THEN it is made once per group of the setting's list, on that group of this subscription
    assert reader["for_each"] == "${toset(local.trust_resource_groups)}"
    assert reader["scope"] == "/subscriptions/${local.subscription_id}/resourceGroups/${each.value}"
    assert reader["role_definition_name"] == "Reader"
    assert reader["principal_id"] == ref("azurerm_user_assigned_identity.function.principal_id")
    assert local("function_app_settings")[app_settings.TRUST_RESOURCE_GROUPS] == (
        '${join(",", local.trust_resource_groups)}'
    )
    # AND the variable's rule is the one settings.py applies to the setting
    condition = terraform_variables(parsed())["trust_resource_groups"]["validation"][0]["condition"]
    pattern = re.search(r'regex\("([^"]+)"', condition)
    assert pattern
    assert pattern.group(1).replace("\\\\", "\\") == app_settings._RESOURCE_GROUP.pattern


def test_table_names_are_the_app_defaults() -> None:
    # GIVEN the tables, created through Resource Manager (azurerm_storage_table would sign with the key)
    assert not of_type("azurerm_storage_table")
    state, audit = resource("azapi_resource.state_table"), resource("azapi_resource.audit_table")
    # THEN they live in the account's table service under the names the app defaults to
    for table in (state, audit):
        assert table["type"].startswith("Microsoft.Storage/storageAccounts/tableServices/tables@")
        assert table["parent_id"] == "${azurerm_storage_account.this.id}/tableServices/default"
    assert (state["name"], audit["name"]) == (app_settings.DEFAULT_STATE_TABLE, app_settings.DEFAULT_AUDIT_TABLE)


def test_app_settings_put_leaves_no_plain_azurewebjobsstorage() -> None:
    # GIVEN the PUT that replaces the settings azurerm writes (it adds a keyless AzureWebJobsStorage)
    put = resource(APP_SETTINGS_PUT)
    function = resource(FUNCTION_APP)
    # THEN it targets the function app's appsettings, after every change the provider makes to it
    assert put["method"] == "PUT"
    assert put["type"].startswith("Microsoft.Web/sites/config@")
    assert put["resource_id"] == ref(f"{FUNCTION_APP}.id") + "/config/appsettings"
    assert block(put, "lifecycle")["replace_triggered_by"] == [ref(FUNCTION_APP)]
    # AND it writes exactly the app's settings: the same local plus the Application Insights
    # connection string the provider takes from site_config
    assert function["app_settings"] == "${local.function_app_settings}"
    insights = block(function, "site_config")["application_insights_connection_string"]
    properties = put["body"]["properties"]
    assert properties.startswith("${merge(local.function_app_settings, {")
    assert f"APPLICATIONINSIGHTS_CONNECTION_STRING = {insights[2:-1]}" in properties.replace('"', "")
    # AND no plain AzureWebJobsStorage is among them
    assert "AzureWebJobsStorage" not in local("function_app_settings")
    assert "AzureWebJobsStorage =" not in properties.replace('"', "")


def test_function_app_reads_its_package_with_its_identity() -> None:
    # GIVEN the function app; THEN its deployment package is read from app-package with its own
    # identity, and publishing takes no site password
    function = resource(FUNCTION_APP)
    assert function["storage_authentication_type"] == "UserAssignedIdentity"
    assert function["storage_user_assigned_identity_id"] == ref("azurerm_user_assigned_identity.function.id")
    assert function["storage_container_endpoint"] == (
        "${azurerm_storage_account.this.primary_blob_endpoint}${azurerm_storage_container.app_package.name}"
    )
    assert function["webdeploy_publish_basic_authentication_enabled"] is False


# ---------------------------------------------------------------- Service Bus


def test_operator_results_default_rule_is_deleted_after_the_sql_rule_exists() -> None:
    # GIVEN the SQL rule of operator-results and the action that deletes `$Default`
    rule = resource("azurerm_servicebus_subscription_rule.command_results")
    delete = resource(DEFAULT_RULE_DELETE)
    # THEN the delete targets operator-results' own $Default rule ...
    assert delete["method"] == "DELETE"
    assert delete["type"].startswith("Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@")
    assert delete["resource_id"] == rule["subscription_id"].replace(".id}", ".id}/rules/$Default")
    assert rule["subscription_id"] == ref("azurerm_servicebus_subscription.operator_results.id")
    # ... and runs only once the SQL rule is there, so the subscription always has a rule
    assert delete["depends_on"] == ["${azurerm_servicebus_subscription_rule.command_results}"]
    # ... and again for a replaced subscription, which keeps its id but gets a new $Default
    operator_results = ref("azurerm_servicebus_subscription.operator_results")
    assert block(delete, "lifecycle")["replace_triggered_by"] == [operator_results]
    # AND the function's subscription keeps its $Default rule (it takes every event)
    function_subscription = ref("azurerm_servicebus_subscription.functions.id")
    assert all(body.get("subscription_id") != function_subscription for body in resources().values())


def test_namespace_capacity_follows_the_sku() -> None:
    # GIVEN the namespace; THEN its capacity fits whichever tier var.servicebus_sku picks
    namespace = resource("azurerm_servicebus_namespace.this")
    assert namespace["sku"] == "${var.servicebus_sku}"
    # Premium needs a messaging unit and a partition; Standard rejects anything but 0
    assert namespace["capacity"] == '${var.servicebus_sku == "Premium" ? 1 : 0}'
    assert namespace["premium_messaging_partitions"] == '${var.servicebus_sku == "Premium" ? 1 : 0}'


# ---------------------------------------------------------------- roles


def test_every_assignment_names_a_service_principal() -> None:
    # GIVEN every role assignment, of the root and of the per-VM commands module; THEN each says
    # its principal is a service principal (a new identity is then not looked up in Entra ID
    # before it has replicated)
    assignments = of_type("azurerm_role_assignment")
    # (each commands mode has its own: the queue's two, or the topic's sender)
    assert len(assignments) == len(facts().grants) + len(COMMANDS_MODE_ASSIGNMENTS["topic"])
    module = load_terraform(VM_COMMANDS_MODULE)
    assignments.update(terraform_resources(module))
    for address, body in assignments.items():
        if address.startswith("azurerm_role_assignment."):
            assert body["principal_type"] == "ServicePrincipal", address


def test_drainer_assignments_exist_only_with_a_load_balancer() -> None:
    # GIVEN the assignments of the custom role and the others
    assignments = of_type("azurerm_role_assignment")
    drainer = {address: body for address, body in assignments.items() if "role_definition_id" in body}
    others = {address: body for address, body in assignments.items() if "role_definition_id" not in body}
    assert len(drainer) == 3
    # THEN the drainer ones are counted on a given load balancer, the commands ones on the commands
    # mode (one per commands entity), and the others always exist
    assert local("drain_enabled") == '${var.drain_load_balancer_name != ""}'
    for address, body in drainer.items():
        assert body["count"] == "${local.drain_enabled ? 1 : 0}", address
    for mode, addresses in COMMANDS_MODE_ASSIGNMENTS.items():
        for address in addresses:
            expected = (
                "${local.commands_via_topic ? var.commands_shards : 0}"
                if mode == "topic"
                else "${local.commands_via_topic ? 0 : var.commands_shards}"
            )
            assert others.pop(address)["count"] == expected, address
    # the control plane's path ones on its switch (central.tf)
    for address in (
        "azurerm_role_assignment.system_topic_sends_central",
        "azurerm_role_assignment.function_receives_central",
    ):
        assert others.pop(address)["count"] == "${local.central_count}", address
    assert local("central_count") == "${var.central_reports ? 1 : 0}"
    assert all("count" not in body for body in others.values())
    # AND a load balancer without its virtual network is refused at plan time
    preconditions = [
        condition["condition"]
        for body in drainer.values()
        for lifecycle in body.get("lifecycle", [])
        for condition in lifecycle.get("precondition", [])
    ]
    assert preconditions == ['${var.drain_virtual_network_name != ""}']


def test_the_agent_package_is_a_wheel_with_its_hash_and_required_with_the_example() -> None:
    # GIVEN agent_package; THEN it has no default and takes only a wheel URL with its sha256
    assert_agent_package_is_pinned(terraform_variables(parsed())["agent_package"], "agent-servicebus")
    # AND the example scale set refuses to be planned without one
    conditions = {
        condition["condition"]: condition["error_message"]
        for lifecycle in resource(SCALE_SET).get("lifecycle", [])
        for condition in lifecycle.get("precondition", [])
    }
    assert "agent_package is required" in conditions['${var.agent_package != ""}']


def test_drainer_assignments_name_the_role_by_its_subscription_level_id() -> None:
    # GIVEN the drainer assignments; THEN each names the role by the id ARM gives every role
    # definition, /subscriptions/<id>/providers/Microsoft.Authorization/roleDefinitions/<guid> (as the
    # Bicep does), built from the definition's GUID so that the assignment waits for the definition
    drainer = {a: body for a, body in of_type("azurerm_role_assignment").items() if "role_definition_id" in body}
    assert drainer
    assert {body["role_definition_id"] for body in drainer.values()} == {"${local.drainer_role_definition_id}"}
    assert local("drainer_role_definition_id") == (
        "/subscriptions/${local.subscription_id}/providers/Microsoft.Authorization/roleDefinitions/"
        "${azurerm_role_definition.drainer.role_definition_id}"
    )
    assert local("subscription_id") == "${data.azurerm_client_config.current.subscription_id}"


def test_drainer_role_is_defined_in_the_resource_group() -> None:
    # GIVEN the custom role; THEN it lives in the resource group, under the contract's name by
    # default, with no not-actions to hide a wildcard behind
    definition = resource("azurerm_role_definition.drainer")
    assert definition["scope"] == ref("data.azurerm_resource_group.this.id")
    assert definition["name"] == "${var.drainer_role_name}"
    assert terraform_variables(parsed())["drainer_role_name"]["default"] == "Maintenance Bridge Drainer"
    assert block(definition, "permissions").get("not_actions") == []


# ---------------------------------------------------------------- the example scale set and the agent


def cloud_init_replacements() -> dict[str, str]:
    """placeholder -> the expression that replaces it, from local.agent_cloud_init."""
    expression = local("agent_cloud_init")
    return dict(re.findall(r'"(@@[A-Z0-9_]+@@)", ([^()]+\([^()]*\))\)', expression))


def test_cloud_init_placeholders_are_all_replaced() -> None:
    # GIVEN the cloud-init file the scale set boots with, and the replacements the Terraform makes
    cloud_init = AGENT_INSTALL / "cloud-init.yaml"
    assert cloud_init.is_file(), f"{cloud_init} is missing"
    placeholders = set(re.findall(r"@@[A-Z0-9_]+@@", cloud_init.read_text(encoding="utf-8")))
    replacements = cloud_init_replacements()
    # THEN every placeholder of the file is replaced, and nothing else is
    assert placeholders == set(replacements)
    assert set(replacements) == {
        "@@AGENT_ENV_B64@@",
        "@@AGENT_UNIT_B64@@",
        "@@INSTALL_SCRIPT_B64@@",
        "@@INSTALL_ENV_B64@@",
    }
    # AND each by base64 of the right content: the environment file, the unit, the installer, the package
    assert replacements["@@AGENT_ENV_B64@@"] == "base64encode(local.agent_environment_file)"
    assert replacements["@@INSTALL_ENV_B64@@"] == 'base64encode("MBRIDGE_PACKAGE=${var.agent_package}\\n")'
    for placeholder, file_name in (
        ("@@AGENT_UNIT_B64@@", "mbridge-agent.service"),
        ("@@INSTALL_SCRIPT_B64@@", "install-agent.sh"),
    ):
        assert replacements[placeholder] == f'filebase64("${{path.module}}/../../agent/{file_name}")'
        assert (AGENT_INSTALL / file_name).is_file(), file_name
    # AND the scale set boots with the result
    assert resource(SCALE_SET)["custom_data"] == "${base64encode(local.agent_cloud_init)}"


def test_filling_the_placeholders_leaves_valid_cloud_init_within_the_custom_data_limit() -> None:
    # GIVEN the cloud-init file filled the way the Terraform fills it: the environment file with
    # the keys it writes (values as long as real ones) and the default package
    text = (AGENT_INSTALL / "cloud-init.yaml").read_text(encoding="utf-8")
    environment = "".join(f"{name}={'x' * 64}\n" for name in local("agent_environment"))
    package = "maintenance-bridge[agent-servicebus] @ https://example.blob.core.windows.net/agent/" + "x" * 120
    fills = {
        "@@AGENT_ENV_B64@@": environment.encode(),
        "@@INSTALL_ENV_B64@@": f"MBRIDGE_PACKAGE={package}\n".encode(),
        "@@AGENT_UNIT_B64@@": (AGENT_INSTALL / "mbridge-agent.service").read_bytes(),
        "@@INSTALL_SCRIPT_B64@@": (AGENT_INSTALL / "install-agent.sh").read_bytes(),
    }
    for placeholder in cloud_init_replacements():
        text = text.replace(placeholder, base64.b64encode(fills[placeholder]).decode("ascii"))
    # THEN no placeholder is left, the document still parses as cloud-config ...
    assert "@@" not in text
    assert text.startswith("#cloud-config")
    document = yaml.safe_load(text)
    assert isinstance(document, dict)
    written = {entry["path"]: base64.b64decode(entry["content"]) for entry in document["write_files"]}
    assert written["/etc/mbridge/agent.env"].decode() == environment
    # ... and it fits Azure's custom data (65535 bytes before base64)
    assert len(text.encode()) <= 65535


def test_agent_environment_holds_only_what_the_agent_reads() -> None:
    # GIVEN the agent's environment file and the variables the agent reads
    environment = local("agent_environment")
    read_by_agent = names_read_from_environment()
    # THEN every MBRIDGE_* name is one the agent reads (AZURE_CLIENT_ID is azure-identity's)
    assert set(environment) - {"AZURE_CLIENT_ID"} <= read_by_agent, sorted(set(environment) - read_by_agent)
    assert environment["MBRIDGE_TRANSPORT"] == "servicebus"
    assert environment["MBRIDGE_SERVICEBUS_NAMESPACE"] == "${local.servicebus_fqdn}"
    assert environment["AZURE_CLIENT_ID"] == ref("azurerm_user_assigned_identity.agent.client_id")
    # AND the agent listens on all interfaces on the port the load balancer probes
    host, port = environment["MBRIDGE_LISTEN"].rsplit(":", 1)
    assert (host, int(port)) == ("0.0.0.0", facts().vmss_health_probe_port)


def test_the_probe_reaches_the_agent_port_and_nothing_else() -> None:
    # GIVEN the NSG of the agents' subnet
    nsg = resource("azurerm_network_security_group.agents")
    rules = sorted(nsg["security_rule"], key=lambda rule: int(rule["priority"]))
    from_probe = [rule for rule in rules if rule["source_address_prefix"] == "AzureLoadBalancer"]
    # THEN the first AzureLoadBalancer rule allows the probe port only ...
    first, *rest = from_probe
    assert (first["access"], first["destination_port_range"]) == ("Allow", str(facts().vmss_health_probe_port))
    # ... and a later one (still before the default 65001 allow) denies every other port
    assert any(rule["access"] == "Deny" and rule["destination_port_range"] == "*" for rule in rest)
    assert all(int(rule["priority"]) < 65000 for rule in rules)
    # AND nothing is open to the internet
    assert not [rule for rule in rules if rule["source_address_prefix"] in ("*", "Internet", "0.0.0.0/0")]


def test_scale_set_vms_have_no_public_address() -> None:
    # GIVEN the scale set's NIC
    nic = block(resource(SCALE_SET), "network_interface")
    ip_configuration = block(nic, "ip_configuration")
    # THEN it has no public IP; the only public IP is the NAT gateway's, for outbound traffic
    assert "public_ip_address" not in ip_configuration
    assert set(of_type("azurerm_public_ip")) == {"azurerm_public_ip.nat"}
    association = resource("azurerm_nat_gateway_public_ip_association.agents")
    assert association["public_ip_address_id"] == ref("azurerm_public_ip.nat[0].id")
    assert resource("azurerm_subnet.agents")["default_outbound_access_enabled"] is False


def test_scale_set_is_the_optional_example() -> None:
    # GIVEN every resource of the example file
    example = load_terraform_file(TERRAFORM_AZURE / "vmss_example.tf")
    # THEN each is counted on deploy_example_scale_set
    assert local("example_count") == "${var.deploy_example_scale_set && !local.commands_via_topic ? 1 : 0}"
    for address, body in example.items():
        assert body["count"] == "${local.example_count}", address
    # AND the scale set takes SSH keys only
    scale_set = resource(SCALE_SET)
    assert scale_set["disable_password_authentication"] is True
    assert "admin_password" not in scale_set


def load_terraform_file(path: Path) -> dict[str, Body]:
    """The resources of one .tf file (load_terraform merges a whole directory)."""
    options = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)
    document = hcl2.loads(path.read_text(encoding="utf-8"), serialization_options=options)
    return terraform_resources({"resource": document.get("resource", [])})


# ---------------------------------------------------------------- the per-VM commands module


def module_resource(address: str) -> Body:
    found = terraform_resources(load_terraform(VM_COMMANDS_MODULE))
    assert address in found, f"{address} is not declared in {VM_COMMANDS_MODULE.name}"
    return found[address]


def test_the_vm_module_removes_default_and_grants_the_vm_only_after_its_filter_is_in_place() -> None:
    # GIVEN the module's subscription, its filter rule, the `$Default` delete and the receiver role
    subscription = "azurerm_servicebus_subscription.commands"
    rule = module_resource("azurerm_servicebus_subscription_rule.only_this_vm")
    delete = module_resource("azapi_resource_action.remove_default_rule")
    receiver = module_resource("azurerm_role_assignment.vm_receives_its_commands")
    # THEN the delete targets the subscription's own `$Default`, once the filter exists, and again
    # for a replaced subscription (same id, new `$Default`)
    assert rule["subscription_id"] == ref(f"{subscription}.id")
    assert delete["method"] == "DELETE"
    assert delete["resource_id"] == ref(f"{subscription}.id") + "/rules/$Default"
    assert delete["depends_on"] == [ref("azurerm_servicebus_subscription_rule.only_this_vm")]
    assert block(delete, "lifecycle")["replace_triggered_by"] == [ref(subscription)]
    # AND the VM may receive only from this subscription, once `$Default` is gone (until then it
    # passed every VM's commands)
    assert receiver["scope"] == ref(f"{subscription}.id")
    assert receiver["role_definition_name"] == "Azure Service Bus Data Receiver"
    assert receiver["depends_on"] == [ref("azapi_resource_action.remove_default_rule")]


def test_the_vm_module_is_described_validated_and_pinned() -> None:
    module = load_terraform(VM_COMMANDS_MODULE)
    variables = terraform_variables(module)
    for name, body in variables.items():
        assert str(body.get("description", "")).strip(), f"var.{name} has no description"
        assert body.get("type"), f"var.{name} has no type"
        assert body.get("validation"), f"var.{name} is not validated"
    for name, body in terraform_outputs(module).items():
        assert str(body.get("description", "")).strip(), f"output {name} has no description"
    providers = module["terraform"][0]["required_providers"][0]
    root = parsed()["terraform"][0]["required_providers"][0]
    assert set(providers) == {"azurerm", "azapi"}
    for name, spec in providers.items():
        assert spec == root[name], name  # the root's constraints: one provider version for both


def test_the_root_calls_the_vm_module_for_each_vm_in_topic_mode_only() -> None:
    # GIVEN the root's module call
    [call] = [body for entry in parsed().get("module", []) for body in entry.values()]
    # THEN it runs over the given VMs in topic mode, with the commands topic of the VM's shard and
    # the events topic
    assert call["source"] == "./modules/vm_commands_subscription"
    assert call["for_each"] == "${local.commands_via_topic ? var.commands_subscription_vms : {}}"
    assert call["topic_id"] == ref("azurerm_servicebus_topic.commands[local.commands_subscription_shards[each.key]].id")
    assert local("commands_subscription_shards") == (
        "${{for name, principal in var.commands_subscription_vms : "
        "name => parseint(substr(sha256(lower(name)), 0, 8), 16) % var.commands_shards}}"
    )
    assert call["events_topic_id"] == ref("azurerm_servicebus_topic.events.id")
    assert (call["vm_name"], call["principal_id"]) == ("${each.key}", "${each.value}")
    assert local("commands_via_topic") == '${var.commands_mode == "topic"}'


def test_the_webhook_url_is_sensitive_and_takes_a_key_vault_reference() -> None:
    # GIVEN the webhook variables THEN the URL (it holds the webhook's key) is sensitive, and
    # takes an https URL or a Key Vault reference, nothing else
    variables = terraform_variables(parsed())
    url = variables["webhook_url"]
    assert url["sensitive"] is True
    assert url["default"] == ""
    condition = url["validation"][0]["condition"]
    assert 'startswith(var.webhook_url, "https://")' in condition
    assert 'startswith(var.webhook_url, "@Microsoft.KeyVault(")' in condition
    # AND all three reach the app's settings as given (empty: none, and the defaults)
    settings = local("function_app_settings")
    for name, variable in (
        (app_settings.WEBHOOK_URL, "webhook_url"),
        (app_settings.WEBHOOK_TEMPLATE, "webhook_template"),
        (app_settings.WEBHOOK_ACTIONS, "webhook_actions"),
    ):
        assert settings[name] == ref(f"var.{variable}")


def test_a_model_change_rolls_the_scale_set_in_health_gated_batches_as_the_bicep_does() -> None:
    # GIVEN the example scale set, whose custom_data changes with the agent package or the verify key
    scale_set = resource(SCALE_SET)
    # THEN Azure rolls the new model in batches gated on the load balancer's /readyz probe: with
    # "Manual", azurerm would update and reimage every instance back to back during the apply
    assert scale_set["upgrade_mode"] == "Rolling"
    assert scale_set["health_probe_id"] == "${azurerm_lb_probe.readyz[0].id}"
    policy = block(scale_set, "rolling_upgrade_policy")
    # AND with the Bicep's policy (vmss-example.bicep: rollingUpgradePolicy)
    assert policy == {
        "max_batch_instance_percent": 50,
        "max_unhealthy_instance_percent": 50,
        "max_unhealthy_upgraded_instance_percent": 50,
        "pause_time_between_batches": "PT1M",
    }
    assert block(scale_set, "automatic_os_upgrade_policy") == {
        "enable_automatic_os_upgrade": True,
        "disable_automatic_rollback": False,
    }
    # AND the probe is in use by a rule before the policy needs it, and never repairs instances
    assert "${azurerm_lb_rule.http}" in scale_set["depends_on"]
    assert "automatic_instance_repair" not in scale_set
    assert resource("azurerm_lb_probe.readyz")["probe_threshold"] == 2


@pytest.fixture(scope="module")
def variables_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root's variables alone, for `terraform console` (no provider)."""
    module = tmp_path_factory.mktemp("variables")
    (module / "variables.tf").write_text(
        (TERRAFORM_AZURE / "variables.tf").read_text(encoding="utf-8"), encoding="utf-8"
    )
    return module


@console.needs_terraform
def test_telemetry_takes_off_by_default_or_azure_monitor_and_refuses_any_other(variables_module: Path) -> None:
    # GIVEN the function app deployed with MBRIDGE_TELEMETRY from var.telemetry
    assert local("function_app_settings")[app_settings.TELEMETRY] == "${var.telemetry}"
    required = {"resource_group_name": "rg-mbridge"}

    def evaluated(**telemetry: str) -> Any:
        return console.evaluate(variables_module, "var.telemetry", {**required, **telemetry})

    # THEN Terraform takes off, the default, and azure-monitor
    assert evaluated() == "off"
    assert evaluated(telemetry="off") == "off"
    assert evaluated(telemetry="azure-monitor") == "azure-monitor"
    # AND refuses another exporter's name, or another spelling, at plan time
    for value in ("gcp", "Azure-Monitor", "on", ""):
        with pytest.raises(AssertionError, match="telemetry must be off or azure-monitor"):
            evaluated(telemetry=value)
