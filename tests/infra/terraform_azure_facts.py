"""Read the Terraform deployment (infra/terraform/azure/) into one `AzureFacts`.

Every fact comes from the parsed HCL, found by following references the way Terraform would,
not by resource names:

- the app settings are the function app's `app_settings` (a `local` map, resolved) plus
  `site_config.application_insights_connection_string`, which the provider writes into the
  setting APPLICATIONINSIGHTS_CONNECTION_STRING;
- the topic, subscription, queue, tables and storage account are the resources those settings
  reference; operator-results is the subscription that carries a subscription rule;
- the function's identity is the one its AZURE_CLIENT_ID setting names; the agents' identity is
  the one AZURE_CLIENT_ID names in the environment map that the scale set's custom data embeds;
- a role assignment's role is its `role_definition_name`, or the `name` of the custom role its
  `role_definition_id` references; its scope is classified by what the `scope` expression
  references (a resource, or a `local` that builds an ARM id);
- the accepted terminate timeouts are the list in the variable's `contains([...], var.x)`
  validation.

Variables resolve to their defaults: the facts describe the deployment as shipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.infra.azure_facts import (
    AGENT,
    FUNCTION,
    SCOPE_APP_INSIGHTS,
    SCOPE_AUDIT_TABLE,
    SCOPE_COMMANDS_QUEUE,
    SCOPE_EVENTS_TOPIC,
    SCOPE_FUNCTION_SUBSCRIPTION,
    SCOPE_LOAD_BALANCER,
    SCOPE_NIC_RESOURCE_GROUP,
    SCOPE_STATE_TABLE,
    SCOPE_STORAGE_ACCOUNT,
    SCOPE_VIRTUAL_NETWORK,
    AzureFacts,
    RoleGrant,
)
from tests.infra.sources import (
    TERRAFORM_AZURE,
    load_terraform,
    terraform_outputs,
    terraform_resources,
    terraform_variables,
)

# `azurerm_x.name`, `data.azurerm_x.name`, with an optional index and attribute.
_REFERENCE = re.compile(
    r"(?<![\w.])((?:data\.)?(?:azurerm|azapi|random)_\w+\.\w+)(?:\[[^\]]*\])?(?:\.(\w+))?",
)
_VARIABLE = re.compile(r"(?<![\w.])var\.(\w+)")
_LOCAL = re.compile(r"(?<![\w.])local\.(\w+)")
_WHOLE_INTERPOLATION = re.compile(r"^\$\{(.*)\}$", re.DOTALL)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_CONTAINS_LIST = re.compile(r"contains\(\s*\[(?P<items>[^\]]*)\]\s*,\s*var\.(?P<var>\w+)\s*\)")
_ID_TEMPLATE = re.compile(r'"(/subscriptions/[^"]*)"')
_RESOURCE_GROUP_ID_TEMPLATE = re.compile(r"^/subscriptions/\$\{[^}]+\}/resourceGroups/\$\{[^}]+\}$")


class TerraformSourceError(AssertionError):
    """The Terraform does not have the shape the extractor follows (a reference is missing)."""


class _Module:
    """One parsed module with the lookups the extractor needs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        parsed = load_terraform(directory)
        self.resources = terraform_resources(parsed)
        self.data = {f"data.{address}": body for address, body in terraform_resources(parsed, "data").items()}
        self.variables = terraform_variables(parsed)
        self.outputs = terraform_outputs(parsed)
        self.locals: dict[str, Any] = {}
        for block in parsed.get("locals", []):
            self.locals.update(block)

    # ------------------------------------------------------------ values

    def value(self, expression: Any) -> Any:
        """A literal, or the default of `${var.x}`, or the value of `${local.x}` (followed)."""
        for _ in range(10):
            if not isinstance(expression, str):
                return expression
            whole = _WHOLE_INTERPOLATION.match(expression)
            if not whole:
                return expression
            inner = whole.group(1).strip()
            if re.fullmatch(r"var\.\w+", inner):
                expression = self.variable_default(inner[len("var.") :])
            elif re.fullmatch(r"local\.\w+", inner):
                expression = self.local(inner[len("local.") :])
            else:
                return expression
        raise TerraformSourceError(f"too many indirections resolving {expression!r}")

    def variable_default(self, name: str) -> Any:
        variable = self.variables.get(name)
        if variable is None:
            raise TerraformSourceError(f"var.{name} is not declared")
        if "default" not in variable:
            raise TerraformSourceError(f"var.{name} has no default")
        return variable["default"]

    def local(self, name: str) -> Any:
        if name not in self.locals:
            raise TerraformSourceError(f"local.{name} is not defined")
        return self.locals[name]

    def expand(self, text: str, depth: int = 6) -> str:
        """`text` with every `local.x` replaced by its definition, recursively (for classifying)."""
        for _ in range(depth):
            expanded = _LOCAL.sub(lambda match: self._local_as_expression(match.group(1)), text)
            if expanded == text:
                return text
            text = expanded
        return text

    def _local_as_expression(self, name: str) -> str:
        definition = self.local(name)
        if not isinstance(definition, str):
            return repr(definition)
        whole = _WHOLE_INTERPOLATION.match(definition)
        if whole and "${" not in whole.group(1):
            return f"({whole.group(1)})"
        return f'"{definition}"'

    # ------------------------------------------------------------ references

    def referenced(self, expression: Any, kind: str | None = None) -> str:
        """The address of the one resource `expression` references (of resource type `kind`)."""
        addresses = self.references(expression, kind)
        if len(addresses) != 1:
            raise TerraformSourceError(f"expected one {kind or 'resource'} in {expression!r}, found {addresses}")
        return addresses[0]

    def references(self, expression: Any, kind: str | None = None) -> list[str]:
        found: list[str] = []
        for address, _attribute in _REFERENCE.findall(str(expression)):
            resource_type = address.split(".")[-2]
            if (kind is None or resource_type == kind) and address not in found:
                found.append(address)
        return found

    def body(self, address: str) -> dict[str, Any]:
        body = self.data.get(address) if address.startswith("data.") else self.resources.get(address)
        if body is None:
            raise TerraformSourceError(f"{address} is referenced but not declared")
        return body

    def only(self, kind: str) -> tuple[str, dict[str, Any]]:
        matches = [(address, body) for address, body in self.resources.items() if address.split(".")[0] == kind]
        if len(matches) != 1:
            raise TerraformSourceError(f"expected one {kind}, found {[address for address, _ in matches]}")
        return matches[0]

    def of_kind(self, kind: str) -> dict[str, dict[str, Any]]:
        return {address: body for address, body in self.resources.items() if address.split(".")[0] == kind}


def _block(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The first (only) nested block `name` of a resource body."""
    blocks = body.get(name)
    if not blocks:
        raise TerraformSourceError(f"no {name} block")
    first = blocks[0] if isinstance(blocks, list) else blocks
    if not isinstance(first, dict):
        raise TerraformSourceError(f"{name} is not a block: {first!r}")
    return first


def read(directory: Path = TERRAFORM_AZURE) -> AzureFacts:
    return _Extractor(_Module(directory)).facts()


class _Extractor:
    def __init__(self, module: _Module) -> None:
        self.m = module
        self.function_address, self.function = module.only("azurerm_function_app_flex_consumption")
        self.settings = self._app_settings()
        self.topic_address = module.referenced(self.settings["MBRIDGE_EVENTS_TOPIC"], "azurerm_servicebus_topic")
        self.function_subscription_address = module.referenced(
            self.settings["MBRIDGE_EVENTS_SUBSCRIPTION"], "azurerm_servicebus_subscription"
        )
        self.queue_address = module.referenced(self.settings["MBRIDGE_COMMANDS_QUEUE"], "azurerm_servicebus_queue")
        self.state_table_address = module.referenced(self.settings["MBRIDGE_STATE_TABLE"])
        self.audit_table_address = module.referenced(self.settings["MBRIDGE_AUDIT_TABLE"])
        self.storage_address = module.referenced(
            self.settings["AzureWebJobsStorage__accountName"], "azurerm_storage_account"
        )
        self.app_insights_address = module.referenced(
            self.settings["APPLICATIONINSIGHTS_CONNECTION_STRING"], "azurerm_application_insights"
        )
        self.function_identity = module.referenced(self.settings["AZURE_CLIENT_ID"], "azurerm_user_assigned_identity")
        self.vmss_address, self.vmss = module.only("azurerm_linux_virtual_machine_scale_set")
        self.agent_environment = self._agent_environment()
        self.agent_identity = module.referenced(
            self.agent_environment["AZURE_CLIENT_ID"], "azurerm_user_assigned_identity"
        )

    # ------------------------------------------------------------ function app

    def _app_settings(self) -> dict[str, str]:
        settings = self.m.value(self.function.get("app_settings", {}))
        if not isinstance(settings, dict):
            raise TerraformSourceError(f"app_settings is not a map: {settings!r}")
        result = {str(name): str(value) for name, value in settings.items()}
        site_config = _block(self.function, "site_config")
        if "application_insights_connection_string" in site_config:
            result["APPLICATIONINSIGHTS_CONNECTION_STRING"] = str(site_config["application_insights_connection_string"])
        return result

    def _name(self, address: str) -> str:
        return str(self.m.value(self.m.body(address)["name"]))

    # ------------------------------------------------------------ agents

    def _agent_environment(self) -> dict[str, Any]:
        """The environment map the scale set's custom data carries (locals it reaches)."""
        for name in self._locals_reached(str(self.vmss.get("custom_data", ""))):
            definition = self.m.local(name)
            if isinstance(definition, dict) and {"AZURE_CLIENT_ID", "MBRIDGE_TRANSPORT"} <= definition.keys():
                return definition
        raise TerraformSourceError("the scale set's custom data carries no agent environment map")

    def _locals_reached(self, text: str) -> list[str]:
        reached: list[str] = []
        pending = _LOCAL.findall(text)
        while pending:
            name = pending.pop(0)
            if name in reached:
                continue
            reached.append(name)
            pending.extend(_LOCAL.findall(str(self.m.local(name))))
        return reached

    def _custom_data_from_cloud_init(self) -> bool:
        expanded = self.m.expand(str(self.vmss.get("custom_data", "")))
        for path in re.findall(r'file\("\$\{path\.module\}/([^"]+)"\)', expanded):
            if (self.m.directory / path).resolve() == (self.m.directory / "../../agent/cloud-init.yaml").resolve():
                return "base64encode(" in expanded
        return False

    def _health_probe(self) -> tuple[str, int]:
        nic = _block(self.vmss, "network_interface")
        ip_configuration = _block(nic, "ip_configuration")
        pools = self.m.references(ip_configuration.get("load_balancer_backend_address_pool_ids", []))
        for rule in self.m.of_kind("azurerm_lb_rule").values():
            if set(self.m.references(rule.get("backend_address_pool_ids", []))) & set(pools):
                probe = self.m.body(self.m.referenced(rule["probe_id"], "azurerm_lb_probe"))
                return str(self.m.value(probe.get("request_path", ""))), int(self.m.value(probe["port"]))
        raise TerraformSourceError("no load-balancing rule serves the scale set's backend pool")

    # ------------------------------------------------------------ roles

    def _grants(self) -> frozenset[RoleGrant]:
        grants = set()
        for assignment in self.m.of_kind("azurerm_role_assignment").values():
            identity = self.m.referenced(assignment["principal_id"], "azurerm_user_assigned_identity")
            principal = {self.function_identity: FUNCTION, self.agent_identity: AGENT}.get(identity, identity)
            grants.add(RoleGrant(principal, self._role(assignment), self._scope(assignment["scope"])))
        return frozenset(grants)

    def _role(self, assignment: Mapping[str, Any]) -> str:
        if "role_definition_name" in assignment:
            return str(self.m.value(assignment["role_definition_name"]))
        definition = self.m.referenced(assignment["role_definition_id"], "azurerm_role_definition")
        return self._name(definition)

    def _scope(self, expression: Any) -> str:
        """The SCOPE_* name of what a `scope` expression (or the `local` it names) assigns on."""
        text = str(self.m.value(expression))
        whole = _WHOLE_INTERPOLATION.match(text)
        addresses = self.m.references(text)
        if whole and len(addresses) == 1:
            return self._scope_of_resource(addresses[0])
        if "/tableServices/default/tables/" in text:
            # <account id>/tableServices/default/tables/<name>: the table of that name.
            table = self._text_value(text.rsplit("/tables/", 1)[1])
            tables = {
                self._name(self.state_table_address): SCOPE_STATE_TABLE,
                self._name(self.audit_table_address): SCOPE_AUDIT_TABLE,
            }
            return tables.get(table, f"table {table}")
        if "/providers/Microsoft.Network/loadBalancers/" in text:
            # The load balancer the function drains: named by the variable behind MBRIDGE_LB_NAME.
            drained = _VARIABLE.findall(self.settings.get("MBRIDGE_LB_NAME", ""))
            lb_variable = _VARIABLE.findall(text.rsplit("/loadBalancers/", 1)[1])
            return SCOPE_LOAD_BALANCER if drained and lb_variable == drained else f"load balancer {text}"
        if "/providers/Microsoft.Network/virtualNetworks/" in text:
            return SCOPE_VIRTUAL_NETWORK
        group = re.fullmatch(r"/subscriptions/\$\{[^}]+\}/resourceGroups/\$\{([^}]+)\}", text)
        if group:
            # A resource group: allowed only as the one whose NICs the function searches.
            nic_setting = self.settings.get("MBRIDGE_LB_NIC_RESOURCE_GROUP", "")
            searched = set(_LOCAL.findall(nic_setting)) | set(_VARIABLE.findall(nic_setting))
            group_names = set(_LOCAL.findall(group.group(1))) | set(_VARIABLE.findall(group.group(1)))
            return SCOPE_NIC_RESOURCE_GROUP if group_names & searched else f"resource group {text}"
        return f"scope {text}"

    def _text_value(self, fragment: str) -> str:
        """A name written literally, as a variable, or as a resource's `name` attribute."""
        for address, attribute in _REFERENCE.findall(fragment):
            if attribute == "name":
                return self._name(address)
        return str(self.m.value(fragment))

    def _scope_of_resource(self, address: str) -> str:
        by_address = {
            self.topic_address: SCOPE_EVENTS_TOPIC,
            self.function_subscription_address: SCOPE_FUNCTION_SUBSCRIPTION,
            self.queue_address: SCOPE_COMMANDS_QUEUE,
            self.state_table_address: SCOPE_STATE_TABLE,
            self.audit_table_address: SCOPE_AUDIT_TABLE,
            self.storage_address: SCOPE_STORAGE_ACCOUNT,
            self.app_insights_address: SCOPE_APP_INSIGHTS,
        }
        return by_address.get(address, address)

    def _drainer(self) -> tuple[str, dict[str, Any]]:
        custom = {
            self.m.referenced(assignment["role_definition_id"], "azurerm_role_definition")
            for assignment in self.m.of_kind("azurerm_role_assignment").values()
            if "role_definition_id" in assignment
        }
        if len(custom) != 1:
            raise TerraformSourceError(f"expected the assignments to use one custom role, found {sorted(custom)}")
        address = custom.pop()
        return address, self.m.body(address)

    def _assignable_to_resource_group(self, definition: Mapping[str, Any]) -> bool:
        """Every assignable scope is a resource group (never the subscription), its own one included."""
        scope = self.m.references(definition["scope"])
        if len(scope) != 1 or scope[0].split(".")[-2] != "azurerm_resource_group":
            return False
        # Locals that hold an ARM id are written out; the others (conditions) stay as they are.
        expression = _LOCAL.sub(self._id_local, str(self.m.value(definition.get("assignable_scopes", ""))))
        templates = _ID_TEMPLATE.findall(expression)
        if not all(_RESOURCE_GROUP_ID_TEMPLATE.match(template) for template in templates):
            return False
        references = _REFERENCE.findall(_ID_TEMPLATE.sub('""', expression))
        groups = {address for address, attribute in references if attribute == "id"}
        others = {address for address, _ in references} - groups
        all_groups = all(address.split(".")[-2] == "azurerm_resource_group" for address in groups)
        return all_groups and not others and scope[0] in groups

    def _id_local(self, match: re.Match[str]) -> str:
        definition = self.m.local(match.group(1))
        if isinstance(definition, str) and definition.startswith("/subscriptions/"):
            return f'"{definition}"'
        return match.group(0)

    # ------------------------------------------------------------ scale set parameter

    def _allowed_values(self, variable: str) -> tuple[str, ...]:
        for validation in self.m.variables[variable].get("validation", []):
            found = _CONTAINS_LIST.search(str(validation.get("condition", "")))
            if found and found.group("var") == variable:
                return tuple(_QUOTED.findall(found.group("items")))
        raise TerraformSourceError(f"var.{variable} has no contains([...], var.{variable}) validation")

    # ------------------------------------------------------------ all together

    def facts(self) -> AzureFacts:
        m = self.m
        namespace = m.body(m.referenced(m.body(self.topic_address)["namespace_id"], "azurerm_servicebus_namespace"))
        topic = m.body(self.topic_address)
        function_subscription = m.body(self.function_subscription_address)
        rules = m.of_kind("azurerm_servicebus_subscription_rule")
        if len(rules) != 1:
            raise TerraformSourceError(f"expected one subscription rule (operator-results), found {sorted(rules)}")
        rule = next(iter(rules.values()))
        operator_results = m.referenced(rule["subscription_id"], "azurerm_servicebus_subscription")
        queue = m.body(self.queue_address)
        plan = m.body(m.referenced(self.function["service_plan_id"], "azurerm_service_plan"))
        function_identity_block = _block(self.function, "identity")
        storage = m.body(self.storage_address)
        app_insights = m.body(self.app_insights_address)
        _, drainer = self._drainer()
        notification = _block(self.vmss, "termination_notification")
        not_before_variable = _VARIABLE.findall(str(notification.get("timeout", "")))
        if len(not_before_variable) != 1:
            raise TerraformSourceError("termination_notification.timeout is not set from one variable")
        vmss_identity = _block(self.vmss, "identity")
        probe_path, probe_port = self._health_probe()

        return AzureFacts(
            servicebus_sku=str(m.value(namespace["sku"])),
            servicebus_local_auth_disabled=m.value(namespace.get("local_auth_enabled", True)) is False,
            servicebus_min_tls=str(m.value(namespace.get("minimum_tls_version", ""))),
            events_topic=self._name(self.topic_address),
            events_duplicate_detection=m.value(topic.get("requires_duplicate_detection")) is True,
            events_duplicate_window=str(m.value(topic.get("duplicate_detection_history_time_window", ""))),
            function_subscription=self._name(self.function_subscription_address),
            function_subscription_max_delivery_count=int(m.value(function_subscription["max_delivery_count"])),
            function_subscription_dead_letter_on_expiration=(
                m.value(function_subscription.get("dead_lettering_on_message_expiration")) is True
            ),
            function_subscription_lock=str(m.value(function_subscription.get("lock_duration", ""))),
            operator_results_subscription=self._name(operator_results),
            operator_results_filter=str(m.value(rule.get("sql_filter", ""))),
            commands_queue=self._name(self.queue_address),
            commands_requires_session=m.value(queue.get("requires_session")) is True,
            commands_lock=str(m.value(queue.get("lock_duration", ""))),
            commands_ttl=str(m.value(queue.get("default_message_ttl", ""))),
            commands_duplicate_detection=m.value(queue.get("requires_duplicate_detection")) is True,
            commands_max_delivery_count=int(m.value(queue.get("max_delivery_count", 0))),
            function_plan_sku=str(m.value(plan["sku_name"])),
            function_linux=m.value(plan.get("os_type")) == "Linux",
            function_runtime=str(m.value(self.function["runtime_name"])),
            function_runtime_version=str(m.value(self.function["runtime_version"])),
            function_user_assigned_identity=(
                "UserAssigned" in str(m.value(function_identity_block.get("type", "")))
                and self.function_identity in m.references(function_identity_block.get("identity_ids", []))
            ),
            function_https_only=m.value(self.function.get("https_only")) is True,
            function_app_settings=self.settings,
            state_table=self._name(self.state_table_address),
            audit_table=self._name(self.audit_table_address),
            storage_shared_key_disabled=m.value(storage.get("shared_access_key_enabled", True)) is False,
            storage_min_tls=str(m.value(storage.get("min_tls_version", ""))),
            # azurerm's default for allow_nested_items_to_be_public is true.
            storage_public_blob_access=m.value(storage.get("allow_nested_items_to_be_public", True)) is not False,
            app_insights_local_auth_disabled=m.value(app_insights.get("local_authentication_disabled")) is True,
            grants=self._grants(),
            drainer_actions=frozenset(str(action) for action in _block(drainer, "permissions").get("actions", [])),
            drainer_assignable_to_resource_group=self._assignable_to_resource_group(drainer),
            vmss_terminate_notification_enabled=m.value(notification.get("enabled")) is True,
            vmss_not_before_parameter=not_before_variable[0],
            not_before_allowed=self._allowed_values(not_before_variable[0]),
            not_before_default=str(m.variable_default(not_before_variable[0])),
            vmss_uses_agent_identity=(
                "UserAssigned" in str(m.value(vmss_identity.get("type", "")))
                and m.references(vmss_identity.get("identity_ids", [])) == [self.agent_identity]
            ),
            vmss_custom_data_from_cloud_init=self._custom_data_from_cloud_init(),
            vmss_health_probe_path=probe_path,
            vmss_health_probe_port=probe_port,
            outputs=frozenset(m.outputs),
        )
