"""Diagnostic settings and the dead-letter alert of the Azure deployment, in the Bicep and the Terraform.

GIVEN infra/azure/ (modules/diagnostics.bicep, called from main.bicep) read with pycep, and
      infra/terraform/azure/ read with python-hcl2
WHEN  their diagnostic settings and metric alerts are listed
THEN  both send the signing vault's AuditEvent, the namespace's logs and the function app's
      FunctionAppLogs, each with AllMetrics, to the deployment's Log Analytics workspace, and both
      alert on any entity's dead letters, notifying an optional action group; the two agree.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from tests.infra.sources import (
    BICEP_DIR,
    TERRAFORM_AZURE,
    load_bicep,
    load_terraform,
    terraform_resources,
    terraform_variables,
)

Body = dict[str, Any]

DIAGNOSTICS_MODULE = BICEP_DIR / "modules" / "diagnostics.bicep"
DIAGNOSTIC_SETTING = "Microsoft.Insights/diagnosticSettings"
METRIC_ALERT = "Microsoft.Insights/metricAlerts"
# Each watched resource, as the Bicep module's `existing` symbol, the Terraform resource and the
# resource type both name.
WATCHED = {
    "vault": ("azurerm_key_vault.signing", "Microsoft.KeyVault/vaults"),
    "namespace": ("azurerm_servicebus_namespace.this", "Microsoft.ServiceBus/namespaces"),
    "site": ("azurerm_function_app_flex_consumption.this", "Microsoft.Web/sites"),
}
# What each must send: log categories ("category:...") or category groups ("group:..."), and metrics.
EXPECTED_LOGS = {
    "Microsoft.KeyVault/vaults": {"category:AuditEvent"},
    "Microsoft.ServiceBus/namespaces": {"group:allLogs"},
    "Microsoft.Web/sites": {"category:FunctionAppLogs"},
}


def accessor(expression: Any) -> str:
    """A pycep property access (`a.b.c`) as its dotted text; a plain string as itself."""
    if isinstance(expression, str):
        return expression
    operands = expression["operator"]["operands"]
    assert expression["operator"]["type"] == "property_accessor", expression
    return f"{accessor(operands['operand_1'])}.{accessor(operands['operand_2'])}"


@cache
def bicep_module() -> Body:
    assert DIAGNOSTICS_MODULE.is_file(), "infra/azure/modules/diagnostics.bicep is missing"
    return load_bicep(DIAGNOSTICS_MODULE)


def bicep_resources(kind: str) -> dict[str, Body]:
    """The module's declarations of one type, as {symbol: body}, the condition's wrapper removed."""
    found = {}
    for symbol, declaration in (bicep_module().get("resources") or {}).items():
        if declaration["type"] == kind and not declaration["existing"]:
            config = declaration["config"]
            found[symbol] = config["config"] if "condition" in config else config
    return found


def bicep_module_call() -> Body:
    modules = load_bicep(BICEP_DIR / "main.bicep").get("modules") or {}
    calls = [m for m in modules.values() if m["detail"]["path"] == "modules/diagnostics.bicep"]
    assert len(calls) == 1, "main.bicep calls modules/diagnostics.bicep once"
    config = calls[0]["config"]
    assert "condition" not in config, "the diagnostics are deployed with every deployment"
    return dict(config["params"])


@cache
def terraform() -> dict[str, Body]:
    return terraform_resources(load_terraform(TERRAFORM_AZURE))


def of_type(kind: str) -> dict[str, Body]:
    return {key: body for key, body in terraform().items() if key.startswith(f"{kind}.")}


def bicep_settings() -> dict[str, tuple[set[str], set[str], Body]]:
    """{watched resource type: (logs, metrics, properties)} of the Bicep's diagnostic settings."""
    existing = {
        symbol: declaration["type"]
        for symbol, declaration in (bicep_module().get("resources") or {}).items()
        if declaration["existing"]
    }
    settings = {}
    for symbol, body in bicep_resources(DIAGNOSTIC_SETTING).items():
        kind = existing[body["scope"]]
        properties = body["properties"]
        logs = {
            f"category:{log['category']}" if "category" in log else f"group:{log['categoryGroup']}"
            for log in properties["logs"]
        }
        for entry in [*properties["logs"], *properties["metrics"]]:
            assert entry["enabled"] is True, symbol
        metrics = {metric["category"] for metric in properties["metrics"]}
        assert kind not in settings, f"two settings on {kind}"
        settings[kind] = (logs, metrics, properties)
    return settings


def terraform_settings() -> dict[str, tuple[set[str], set[str], Body]]:
    """{watched resource type: (logs, metrics, body)} of the Terraform's diagnostic settings."""
    kinds = {f"${{{resource}.id}}": kind for resource, kind in WATCHED.values()}
    settings = {}
    for key, body in of_type("azurerm_monitor_diagnostic_setting").items():
        if body["target_resource_id"] not in kinds:
            continue  # the storage account's blob and table services (main.tf)
        kind = kinds[body["target_resource_id"]]
        logs = {
            f"category:{log['category']}" if "category" in log else f"group:{log['category_group']}"
            for log in body.get("enabled_log", [])
        }
        metrics = {metric["category"] for metric in body.get("enabled_metric", [])}
        assert kind not in settings, f"two settings on {kind}: {key}"
        settings[kind] = (logs, metrics, body)
    return settings


# ---------------------------------------------------------------- diagnostic settings


def test_bicep_sends_the_vault_the_namespace_and_the_app_to_the_workspace() -> None:
    settings = bicep_settings()
    assert set(settings) == set(EXPECTED_LOGS)
    for kind, (logs, metrics, properties) in settings.items():
        assert logs == EXPECTED_LOGS[kind], kind
        assert metrics == {"AllMetrics"}, kind
        # to the Log Analytics workspace only, which main.bicep passes from monitoring.bicep
        assert properties["workspaceId"] == "workspaceId", kind
        assert not {"storageAccountId", "eventHubAuthorizationRuleId"} & set(properties), kind
    params = bicep_module_call()
    assert accessor(params["workspaceId"]) == "monitoring.outputs.workspaceId"
    assert accessor(params["namespaceName"]) == "serviceBus.outputs.namespaceName"
    assert accessor(params["functionAppName"]) == "functionApp.outputs.appName"
    # AND the workspace output is the workspace's id
    monitoring = load_bicep(BICEP_DIR / "modules" / "monitoring.bicep")
    assert accessor(monitoring["outputs"]["workspaceId"]["value"]) == "workspace.id"


def test_bicep_logs_the_signing_vault_when_it_deploys_one() -> None:
    # GIVEN the vault's setting THEN it is deployed with the vault: the vault main.bicep makes,
    # none when signingKeySecretUri names a secret of a vault of your own
    declaration = bicep_module()["resources"]["vaultDiagnostics"]["config"]
    condition = declaration["condition"]["operator"]
    assert condition["type"] == "not"
    assert condition["operands"]["bool_value"]["function"]["parameters"]["item_to_test"] == "vaultName"
    vault_name = bicep_module_call()["vaultName"]["operator"]
    assert vault_name["type"] == "conditional"
    assert vault_name["operands"]["condition"]["function"]["parameters"]["item_to_test"] == "signingKeySecretUri"
    assert accessor(vault_name["operands"]["true_value"]) == "signingVault.outputs.vaultName"
    assert vault_name["operands"]["false_value"] == ""
    vault_module = load_bicep(BICEP_DIR / "modules" / "signing-vault.bicep")
    assert accessor(vault_module["outputs"]["vaultName"]["value"]) == "vault.name"


def test_terraform_sends_the_vault_the_namespace_and_the_app_to_the_workspace() -> None:
    settings = terraform_settings()
    assert set(settings) == set(EXPECTED_LOGS)
    for kind, (logs, metrics, body) in settings.items():
        assert logs == EXPECTED_LOGS[kind], kind
        assert metrics == {"AllMetrics"}, kind
        assert body["log_analytics_workspace_id"] == "${azurerm_log_analytics_workspace.this.id}", kind
        assert not {"storage_account_id", "eventhub_authorization_rule_id"} & set(body), kind


def test_bicep_and_terraform_log_the_same() -> None:
    bicep = {kind: (logs, metrics) for kind, (logs, metrics, _) in bicep_settings().items()}
    terraform_ = {kind: (logs, metrics) for kind, (logs, metrics, _) in terraform_settings().items()}
    assert bicep == terraform_


# ---------------------------------------------------------------- the dead-letter alert


def test_bicep_alerts_on_any_entity_s_dead_letters() -> None:
    [alert] = bicep_resources(METRIC_ALERT).values()
    assert alert["location"] == "global"
    properties = alert["properties"]
    assert [accessor(scope) for scope in properties["scopes"]] == ["namespace.id"]
    assert properties["enabled"] is True
    assert properties["autoMitigate"] is True
    criteria = properties["criteria"]
    assert criteria["'odata.type'"] == "Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria"
    [criterion] = criteria["allOf"]
    assert criterion["criterionType"] == "StaticThresholdCriterion"
    assert criterion["metricNamespace"] == "Microsoft.ServiceBus/namespaces"
    assert criterion["metricName"] == "DeadletteredMessages"
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
    # one time series per entity, every entity (maintenance-central and later shards included)
    assert criterion["dimensions"] == [{"name": "EntityName", "operator": "Include", "values": ["*"]}]
    # AND an action group only when one is given: none, and the alert still exists
    actions = properties["actions"]["operator"]
    assert actions["type"] == "conditional"
    assert actions["operands"]["condition"]["function"]["parameters"]["item_to_test"] == "alertActionGroupId"
    assert actions["operands"]["true_value"] == []
    assert actions["operands"]["false_value"] == [{"actionGroupId": "alertActionGroupId"}]
    assert bicep_module_call()["alertActionGroupId"] == "alertActionGroupId"
    main = load_bicep(BICEP_DIR / "main.bicep")
    assert main["parameters"]["alertActionGroupId"]["default"] == ""


def test_terraform_alerts_on_any_entity_s_dead_letters() -> None:
    [alert] = of_type("azurerm_monitor_metric_alert").values()
    assert alert["scopes"] == ["${azurerm_servicebus_namespace.this.id}"]
    assert alert["enabled"] is True
    assert alert["auto_mitigate"] is True
    [criteria] = alert["criteria"]
    assert criteria["metric_namespace"] == "Microsoft.ServiceBus/namespaces"
    assert criteria["metric_name"] == "DeadletteredMessages"
    assert (criteria["operator"], criteria["threshold"]) == ("GreaterThan", 0)
    assert criteria["dimension"] == [{"name": "EntityName", "operator": "Include", "values": ["*"]}]
    [dynamic] = alert["dynamic"]
    action = dynamic["action"]
    assert action["for_each"] == '${var.alert_action_group_id == "" ? [] : [var.alert_action_group_id]}'
    assert action["content"] == [{"action_group_id": "${action.value}"}]
    assert terraform_variables(load_terraform(TERRAFORM_AZURE))["alert_action_group_id"]["default"] == ""


def test_bicep_and_terraform_alert_alike() -> None:
    [bicep] = bicep_resources(METRIC_ALERT).values()
    [terraform_] = of_type("azurerm_monitor_metric_alert").values()
    properties = bicep["properties"]
    [criterion] = properties["criteria"]["allOf"]
    [criteria] = terraform_["criteria"]
    assert criterion["timeAggregation"] == criteria["aggregation"]
    assert properties["severity"] == terraform_["severity"]
    assert (properties["evaluationFrequency"], properties["windowSize"]) == (
        terraform_["frequency"],
        terraform_["window_size"],
    )
    assert properties["description"] == terraform_["description"]
