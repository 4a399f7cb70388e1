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
  validation;
- the per-VM commands subscriptions of the isolated mode are the instances of the module
  `vm_commands_subscription` that the root declares with `for_each`, read from the module's own
  files with the call's arguments.

Variables resolve to their defaults: the facts describe the deployment as shipped, in the commands
mode the reader names. A resource's `count` is decided only where it hangs on a variable the reader
sets (the commands mode); whatever else decides it (a load balancer given or not) leaves the
resource counted, as conditional resources count in the contract.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.infra.azure_facts import (
    AGENT,
    DEPLOYMENT_RESOURCE_GROUP,
    DEPLOYMENT_SUBSCRIPTION,
    DRAIN_LOAD_BALANCER,
    DRAIN_METHODS,
    DRAIN_VIRTUAL_NETWORK,
    FUNCTION,
    SCOPE_APP_INSIGHTS,
    SCOPE_AUDIT_TABLE,
    SCOPE_CENTRAL_QUEUE,
    SCOPE_COMMANDS_QUEUE,
    SCOPE_COMMANDS_TOPIC,
    SCOPE_EVENTS_TOPIC,
    SCOPE_FUNCTION_SUBSCRIPTION,
    SCOPE_LOAD_BALANCER,
    SCOPE_NIC_RESOURCE_GROUP,
    SCOPE_SIGNING_SECRET,
    SCOPE_STATE_TABLE,
    SCOPE_STORAGE_ACCOUNT,
    SCOPE_VIRTUAL_NETWORK,
    SCOPE_VM_RESOURCE_GROUPS,
    SYSTEM_TOPIC,
    TELEMETRY_REFUSED,
    TELEMETRY_SETTING,
    AzureFacts,
    IsolatedCommandsFacts,
    RoleGrant,
    VmCommandsSubscription,
    commands_subscription_scope,
    vm_principal,
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
    r"(?<![\w.])((?:data\.)?(?:azurerm|azapi|random)_\w+\.\w+)(?:\[(?:[^\[\]]|\[[^\]]*\])*\])?(?:\.(\w+))?",
)
_VARIABLE = re.compile(r"(?<![\w.])var\.(\w+)")
_LOCAL = re.compile(r"(?<![\w.])local\.(\w+)")
_WHOLE_INTERPOLATION = re.compile(r"^\$\{(.*)\}$", re.DOTALL)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_CONTAINS_LIST = re.compile(r"contains\(\s*\[(?P<items>[^\]]*)\]\s*,\s*var\.(?P<var>\w+)\s*\)")
_ID_TEMPLATE = re.compile(r'"(/subscriptions/[^"]*)"')
_RESOURCE_GROUP_ID_TEMPLATE = re.compile(r"^/subscriptions/\$\{[^}]+\}/resourceGroups/\$\{[^}]+\}$")
_VARIABLE_INTERPOLATION = re.compile(r"\$\{var\.(\w+)\}")
_CONDITIONAL_COUNT = re.compile(r"(?P<condition>.+?)\s*\?\s*(?P<yes>\d+|var\.\w+)\s*:\s*(?P<no>\d+|var\.\w+)")
# A list of names by shard, `[for shard in range(...) : shard == 0 ? "<base>" : ...]`: shard 0's.
_SHARD_ZERO = re.compile(r'^\[for shard in range\([^)]*\)\s*:\s*shard == 0 \? "([^"]+)"')
_COMPARISON = re.compile(r'var\.(?P<var>\w+)\s*(?P<op>==|!=)\s*"(?P<value>[^"]*)"')
VM_COMMANDS_MODULE = "./modules/vm_commands_subscription"
_CHOICE = re.compile(r"(?P<condition>[^?]+?)\s*\?\s*(?P<yes>[^:]+?)\s*:\s*(?P<no>.+)")


_LOCAL_ONLY = re.compile(r"\$\{\s*local\.[A-Za-z0-9_]+\s*\}")


class TerraformSourceError(AssertionError):
    """The Terraform does not have the shape the extractor follows (a reference is missing)."""


class _Module:
    """One parsed module with the lookups the extractor needs. `given`: values of its variables
    that are set (a module call's arguments, or what the reader assumes of the root's)."""

    def __init__(self, directory: Path, given: Mapping[str, Any] | None = None) -> None:
        self.directory = directory
        self.given = dict(given or {})
        parsed = load_terraform(directory)
        self.resources = terraform_resources(parsed)
        self.data = {f"data.{address}": body for address, body in terraform_resources(parsed, "data").items()}
        self.variables = terraform_variables(parsed)
        self.outputs = terraform_outputs(parsed)
        self.locals: dict[str, Any] = {}
        for block in parsed.get("locals", []):
            self.locals.update(block)
        self.calls: dict[str, dict[str, Any]] = {
            name: body for block in parsed.get("module", []) for name, body in block.items()
        }

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
            elif keyed := re.fullmatch(r"local\.(\w+)\[var\.(\w+)\]", inner):
                # A map of locals chosen by a variable (the drainer's actions by drain method).
                expression = self.local(keyed.group(1))[self.variable_default(keyed.group(2))]
            elif re.fullmatch(r"local\.\w+\[count\.index\]", inner):
                # A name by shard (commands_shards.tf): the facts are those of shard 0, the one
                # entity of a deployment as shipped (commands_shards = 1).
                listed = _WHOLE_INTERPOLATION.match(str(self.local(inner[len("local.") : -len("[count.index]")])))
                first = _SHARD_ZERO.match(listed.group(1).strip()) if listed else None
                if first is None:
                    return expression
                return first.group(1)
            else:
                return expression
        raise TerraformSourceError(f"too many indirections resolving {expression!r}")

    def variable_default(self, name: str) -> Any:
        """The variable's value: as given, else its default."""
        variable = self.variables.get(name)
        if variable is None:
            raise TerraformSourceError(f"var.{name} is not declared")
        if name in self.given:
            return self.given[name]
        if "default" not in variable:
            raise TerraformSourceError(f"var.{name} has no default")
        return variable["default"]

    def text(self, expression: Any) -> Any:
        """`value`, with `${var.x}` inside a string replaced by a given variable's text."""
        value = self.value(expression)
        if not isinstance(value, str):
            return value
        return _VARIABLE_INTERPOLATION.sub(
            lambda match: str(self.given[match.group(1)]) if match.group(1) in self.given else match.group(0), value
        )

    # ------------------------------------------------------------ counts

    def exists(self, body: Mapping[str, Any]) -> bool | None:
        """False when the resource's `count` is 0 by the given variables; True for 1 or no count;
        None when it depends on something else."""
        if "count" not in body:
            return True
        count = self._number(body["count"])
        return None if count is None else count > 0

    def _number(self, expression: Any) -> int | None:
        value = self.value(expression)
        if isinstance(value, int):
            return value
        whole = _WHOLE_INTERPOLATION.match(str(value))
        if not whole:
            return None
        conditional = _CONDITIONAL_COUNT.fullmatch(whole.group(1).strip())
        if not conditional:
            return None
        decided = self.truth(conditional.group("condition"))
        if decided is None:
            return None
        branch = conditional.group("yes" if decided else "no")
        return int(branch) if branch.isdigit() else self._number(f"${{{branch}}}")

    def truth(self, condition: str) -> bool | None:
        """A condition made of `&&`, `!`, `var.x`, `local.y` and `var.x == "s"` / `!=`, decided by
        the given variables only (None: it depends on something else)."""
        terms = [self._term(term.strip()) for term in condition.split("&&")]
        if False in terms:
            return False
        return True if all(term is True for term in terms) else None

    def _term(self, term: str) -> bool | None:
        if term.startswith("!"):
            inner = self._term(term[1:].strip())
            return None if inner is None else not inner
        if term.startswith("(") and term.endswith(")"):
            return self.truth(term[1:-1])
        comparison = _COMPARISON.fullmatch(term)
        if comparison:
            name = comparison.group("var")
            if name not in self.given:
                return None
            return (self.given[name] == comparison.group("value")) is (comparison.group("op") == "==")
        local = re.fullmatch(r"local\.(\w+)", term)
        if local:
            definition = self.local(local.group(1))
            whole = _WHOLE_INTERPOLATION.match(str(definition))
            return self.truth(whole.group(1)) if whole else None
        variable = re.fullmatch(r"var\.(\w+)", term)
        if variable and variable.group(1) in self.given:
            given = self.given[variable.group(1)]
            return given if isinstance(given, bool) else None
        return None

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
    """The deployment as shipped, in the queue mode (commands_mode's default)."""
    return _Extractor(_Module(directory, given={"commands_mode": "queue"})).facts()


def read_isolated(vms: Mapping[str, str], directory: Path = TERRAFORM_AZURE) -> IsolatedCommandsFacts:
    """The deployment in the topic mode, with commands subscriptions for `vms` (name -> principal id)."""
    given = {"commands_mode": "topic", "commands_subscription_vms": dict(vms)}
    return _Extractor(_Module(directory, given=given)).isolated_facts()


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
        self.commands_topic_address = module.referenced(
            self.settings["MBRIDGE_COMMANDS_TOPIC"], "azurerm_servicebus_topic"
        )
        self.state_table_address = module.referenced(self.settings["MBRIDGE_STATE_TABLE"])
        self.audit_table_address = module.referenced(self.settings["MBRIDGE_AUDIT_TABLE"])
        self.storage_address = module.referenced(
            self.settings["AzureWebJobsStorage__accountName"], "azurerm_storage_account"
        )
        self.app_insights_address = module.referenced(
            self.settings["APPLICATIONINSIGHTS_CONNECTION_STRING"], "azurerm_application_insights"
        )
        self.signing_secret_address = module.referenced(self.settings["MBRIDGE_SIGNING_KEY"], "azapi_resource")
        self.central_queue_address = module.referenced(
            self.settings["MBRIDGE_CENTRAL_QUEUE"], "azurerm_servicebus_queue"
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
        # A setting written as a local is that local's definition (the signing key's reference);
        # variables stay as written, so that what a setting names can be followed.
        result = {
            str(name): str(self.m.value(value)) if _LOCAL_ONLY.fullmatch(str(value)) else str(value)
            for name, value in settings.items()
        }
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
            if self.m.exists(assignment) is False:
                continue
            principal = self._principal(assignment["principal_id"])
            grants.add(RoleGrant(principal, self._role(assignment), self._assignment_scope(assignment)))
        for instance in self._vm_subscription_modules():
            grants |= self._module_grants(instance)
        return frozenset(grants)

    def _principal(self, expression: Any) -> str:
        """FUNCTION, AGENT, SYSTEM_TOPIC (the system-assigned identity of the Event Grid system topic),
        or the address of what else the principal id is read from."""
        topics = self.m.references(expression, "azurerm_eventgrid_system_topic")
        if topics and str(expression).endswith(".identity[0].principal_id}"):
            return SYSTEM_TOPIC
        identity = self.m.referenced(expression, "azurerm_user_assigned_identity")
        return {self.function_identity: FUNCTION, self.agent_identity: AGENT}.get(identity, identity)

    def _assignment_scope(self, assignment: Mapping[str, Any]) -> str:
        if self._per_trust_resource_group(assignment):
            return SCOPE_VM_RESOURCE_GROUPS
        return self._scope(assignment["scope"])

    def _trust_resource_groups_local(self) -> str | None:
        """The local MBRIDGE_TRUST_RESOURCE_GROUPS is written from."""
        return self._joined_local("MBRIDGE_TRUST_RESOURCE_GROUPS")

    def _joined_local(self, setting: str) -> str | None:
        """The local an app setting is written from: `join(",", local.x)`."""
        found = re.fullmatch(r'\$\{join\(",",\s*local\.(\w+)\)\}', self.settings.get(setting, ""))
        return found.group(1) if found else None

    def _per_trust_resource_group(self, assignment: Mapping[str, Any]) -> bool:
        """An assignment made once per element of that local, on the resource group (of this
        subscription) the element names."""
        name = self._trust_resource_groups_local()
        if name is None or assignment.get("for_each") not in (f"${{toset(local.{name})}}", f"${{local.{name}}}"):
            return False
        scope = str(self.m.value(assignment["scope"]))
        return bool(
            re.fullmatch(r"/subscriptions/\$\{local\.subscription_id\}/resourceGroups/\$\{each\.(?:key|value)\}", scope)
        )

    def _joined_setting_default(self, setting: str) -> tuple[str, ...]:
        """What a `join(",", local.x)` setting names with the variables at their defaults, where
        `local.x = length(var.y) > 0 ? var.y : [...]`: DEPLOYMENT_RESOURCE_GROUP for the name of the
        resource group the function app is deployed into, DEPLOYMENT_SUBSCRIPTION for the
        subscription of the provider's client configuration."""
        name = self._joined_local(setting)
        if name is None:
            raise TerraformSourceError(f'{setting} is not join(",", local.x)')
        whole = _WHOLE_INTERPOLATION.match(str(self.m.local(name)))
        choice = _CHOICE.fullmatch(whole.group(1).strip()) if whole else None
        condition = re.fullmatch(r"length\(var\.(\w+)\)\s*>\s*0", choice.group("condition").strip()) if choice else None
        if choice is None or condition is None:
            raise TerraformSourceError(f"local.{name} is not `length(var.x) > 0 ? var.x : [...]`")
        given = self.m.variable_default(condition.group(1))
        branch = choice.group("yes" if given else "no").strip()
        if branch == f"var.{condition.group(1)}":
            return tuple(str(group) for group in given)
        listed = re.fullmatch(r"\[(.*)\]", branch)
        if listed is None:
            raise TerraformSourceError(f"local.{name}: the default is not a list: {branch}")
        own = {}
        group = _WHOLE_INTERPOLATION.match(str(self.function["resource_group_name"]))
        if group:
            own[group.group(1).strip()] = DEPLOYMENT_RESOURCE_GROUP
        for local_name, definition in self.m.locals.items():
            if definition == "${data.azurerm_client_config.current.subscription_id}":
                own[f"local.{local_name}"] = DEPLOYMENT_SUBSCRIPTION
        return tuple(own.get(item.strip(), item.strip()) for item in listed.group(1).split(","))

    def _role(self, assignment: Mapping[str, Any]) -> str:
        if "role_definition_name" in assignment:
            return str(self.m.value(assignment["role_definition_name"]))
        definition = self.m.referenced(self.m.expand(str(assignment["role_definition_id"])), "azurerm_role_definition")
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
            self.commands_topic_address: SCOPE_COMMANDS_TOPIC,
            self.state_table_address: SCOPE_STATE_TABLE,
            self.audit_table_address: SCOPE_AUDIT_TABLE,
            self.storage_address: SCOPE_STORAGE_ACCOUNT,
            self.app_insights_address: SCOPE_APP_INSIGHTS,
            self.signing_secret_address: SCOPE_SIGNING_SECRET,
            self.central_queue_address: SCOPE_CENTRAL_QUEUE,
        }
        return by_address.get(address, address)

    def _drain_refusal(self, virtual_network: str) -> str:
        """The error message of the first lifecycle precondition that fails at plan time for a drain
        load balancer with the given virtual network name, on a resource that exists then; "" when none
        does. Preconditions that depend on other inputs are not decided here."""
        given = {
            **self.m.given,
            "drain_load_balancer_name": DRAIN_LOAD_BALANCER,
            "drain_virtual_network_name": virtual_network,
        }
        module = _Module(self.m.directory, given=given)
        for body in module.resources.values():
            if module.exists(body) is not True:
                continue
            for lifecycle in body.get("lifecycle", []):
                for precondition in lifecycle.get("precondition", []):
                    whole = _WHOLE_INTERPOLATION.match(str(precondition["condition"]))
                    if whole and module.truth(whole.group(1).strip()) is False:
                        return str(module.value(precondition["error_message"]))
        return ""

    def _drainer_actions(self, method: str) -> frozenset[str]:
        """The drainer role's actions when the deployment drains by `method`."""
        module = _Module(self.m.directory, given={**self.m.given, "drain_method": method})
        actions = module.value(_block(module.body(self._drainer()[0]), "permissions").get("actions", []))
        return frozenset(str(action) for action in actions)

    def _drainer(self) -> tuple[str, dict[str, Any]]:
        custom = {
            self.m.referenced(self.m.expand(str(assignment["role_definition_id"])), "azurerm_role_definition")
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

    def _validation_refusal(self, variable: str, value: str) -> str:
        """The error message of the first `contains([...], var.x)` validation of var.x that refuses
        `value`; "" when each such validation takes it."""
        for validation in self.m.variables[variable].get("validation", []):
            found = _CONTAINS_LIST.search(str(validation.get("condition", "")))
            if found and found.group("var") == variable and value not in _QUOTED.findall(found.group("items")):
                return str(validation.get("error_message", ""))
        return ""

    def _telemetry(self) -> dict[str, Any]:
        """The AzureFacts.telemetry_* facts: MBRIDGE_TELEMETRY's variable, the values its validation
        takes and its default, the setting and grants with each value, the refusal of another."""
        text = self.settings.get(TELEMETRY_SETTING, "")
        variables = _VARIABLE.findall(text)
        if len(variables) != 1 or text != f"${{var.{variables[0]}}}":
            raise TerraformSourceError(f"{TELEMETRY_SETTING} is not set from one variable: {text!r}")
        [variable] = variables
        allowed = self._allowed_values(variable)
        setting, grants = {}, {}
        for value in allowed:
            chosen = _Extractor(_Module(self.m.directory, given={**self.m.given, variable: value}))
            setting[value] = chosen._setting_value(chosen.settings[TELEMETRY_SETTING])
            grants[value] = chosen._grants()
        return {
            "telemetry_switch": variable,
            "telemetry_allowed": allowed,
            "telemetry_default": str(self.m.variable_default(variable)),
            "telemetry_setting": setting,
            "telemetry_grants": grants,
            "telemetry_refusal": self._validation_refusal(variable, TELEMETRY_REFUSED),
        }

    # ------------------------------------------------------------ the isolated mode's module

    def _vm_subscription_modules(self) -> list[_Module]:
        """Each instance of the vm_commands_subscription module the root declares, as a module with
        the call's arguments given (`each.key` / `each.value` filled in; references to the root's
        resources kept as text)."""
        instances = []
        for name, call in self.m.calls.items():
            if call.get("source") != VM_COMMANDS_MODULE:
                continue
            elements = self._for_each(name, call.get("for_each"))
            for key, value in elements.items():
                arguments = {
                    argument: self._each(expression, key, value)
                    for argument, expression in call.items()
                    if argument not in ("source", "for_each", "depends_on", "providers")
                }
                instances.append(_Module((self.m.directory / call["source"]).resolve(), given=arguments))
        return instances

    def _for_each(self, call: str, expression: Any) -> dict[str, Any]:
        whole = _WHOLE_INTERPOLATION.match(str(expression))
        choice = _CHOICE.fullmatch(whole.group(1).strip()) if whole else None
        if choice is None:
            raise TerraformSourceError(f"module.{call}: for_each is not `condition ? var.x : {{}}`: {expression!r}")
        decided = self.m.truth(choice.group("condition"))
        if decided is None:
            raise TerraformSourceError(f"module.{call}: cannot tell whether for_each applies: {expression!r}")
        branch = choice.group("yes" if decided else "no").strip()
        if branch == "{}":
            return {}
        variable = re.fullmatch(r"var\.(\w+)", branch)
        if variable is None:
            raise TerraformSourceError(f"module.{call}: for_each runs over {branch}, not a variable")
        elements = self.m.variable_default(variable.group(1))
        if not isinstance(elements, dict):
            raise TerraformSourceError(f"module.{call}: var.{variable.group(1)} is not a map")
        return elements

    @staticmethod
    def _each(expression: Any, key: str, value: Any) -> Any:
        if expression == "${each.key}":
            return key
        if expression == "${each.value}":
            return value
        return expression

    def _module_subscription(self, module: _Module) -> tuple[str, dict[str, Any]]:
        subscriptions = module.of_kind("azurerm_servicebus_subscription")
        if len(subscriptions) != 1:
            raise TerraformSourceError(
                f"{module.directory.name}: expected one subscription, found {sorted(subscriptions)}"
            )
        return next(iter(subscriptions.items()))

    def _module_topic(self, module: _Module, subscription: Mapping[str, Any]) -> str:
        """The root topic a module's subscription belongs to (its topic_id argument references it)."""
        topic_id = module.value(subscription["topic_id"])
        return self.m.referenced(topic_id, "azurerm_servicebus_topic")

    def _module_grants(self, module: _Module) -> set[RoleGrant]:
        address, subscription = self._module_subscription(module)
        name = str(module.text(subscription["name"]))
        grants = set()
        for assignment in module.of_kind("azurerm_role_assignment").values():
            if module.exists(assignment) is False:
                continue
            if module.references(assignment["scope"]) == [address]:
                own = self._module_topic(module, subscription) == self.commands_topic_address
                scope = commands_subscription_scope(name) if own else f"subscription {name} of another topic"
            else:
                # An argument of the call: a reference to a resource of the root.
                scope = self._scope(module.value(assignment["scope"]))
            principal = module.value(assignment["principal_id"])
            grants.add(RoleGrant(vm_principal(str(principal)), self._role_in(module, assignment), scope))
        return grants

    @staticmethod
    def _role_in(module: _Module, assignment: Mapping[str, Any]) -> str:
        if "role_definition_name" not in assignment:
            raise TerraformSourceError(f"{module.directory.name}: a role assignment without role_definition_name")
        return str(module.value(assignment["role_definition_name"]))

    def _vm_subscription(self, module: _Module) -> VmCommandsSubscription:
        address, subscription = self._module_subscription(module)
        subscription_id = f"${{{address}.id}}"
        filters = set()
        for rule in module.of_kind("azurerm_servicebus_subscription_rule").values():
            if module.references(rule["subscription_id"]) != [address]:
                continue
            if module.value(rule.get("filter_type")) == "CorrelationFilter":
                properties = _block(rule, "correlation_filter").get("properties", {})
                filters.add(" AND ".join(f"{key} = '{module.value(value)}'" for key, value in properties.items()))
            else:
                filters.add(str(module.text(rule.get("sql_filter", ""))))
        removed = any(
            module.value(action.get("method")) == "DELETE"
            and action.get("resource_id") == f"{subscription_id}/rules/$Default"
            for action in module.of_kind("azapi_resource_action").values()
        )
        return VmCommandsSubscription(
            name=str(module.text(subscription["name"])),
            topic=self._name(self._module_topic(module, subscription)),
            filters=frozenset(filters),
            default_rule_kept=not removed,
            requires_session=module.value(subscription.get("requires_session")) is True,
            lock=str(module.value(subscription.get("lock_duration", ""))),
            ttl=str(module.value(subscription.get("default_message_ttl", ""))),
            max_delivery_count=int(module.value(subscription.get("max_delivery_count", 0))),
        )

    def _setting_value(self, text: str) -> str:
        """An app setting's value where the given variables decide it: `${var.x}`, and
        `${condition ? a : b}` whose branches are "" or a resource's name."""
        value = self.m.value(text)
        whole = _WHOLE_INTERPOLATION.match(str(value))
        choice = _CHOICE.fullmatch(whole.group(1).strip()) if whole else None
        if choice is None:
            return str(value)
        decided = self.m.truth(choice.group("condition"))
        if decided is None:
            return str(value)
        branch = choice.group("yes" if decided else "no").strip()
        if branch == '""':
            return ""
        [(address, attribute)] = _REFERENCE.findall(branch)
        return self._name(address) if attribute == "name" else f"${{{branch}}}"

    def isolated_facts(self) -> IsolatedCommandsFacts:
        m = self.m
        topic = m.body(self.commands_topic_address)
        if m.exists(topic) is not True:
            raise TerraformSourceError("the commands topic is not deployed in the topic mode")
        return IsolatedCommandsFacts(
            commands_topic=self._name(self.commands_topic_address),
            commands_topic_duplicate_detection=m.value(topic.get("requires_duplicate_detection")) is True,
            commands_topic_duplicate_window=str(m.value(topic.get("duplicate_detection_history_time_window", ""))),
            commands_topic_ttl=str(m.value(topic.get("default_message_ttl", ""))),
            # azurerm's default for partitioning_enabled is false.
            commands_topic_partitioned=m.value(topic.get("partitioning_enabled", False)) is True,
            commands_queue_deployed=m.exists(m.body(self.queue_address)) is not False,
            example_scale_set_deployed=m.exists(self.vmss) is not False,
            function_app_settings={name: self._setting_value(text) for name, text in self.settings.items()},
            grants=self._grants(),
            subscriptions=tuple(
                sorted(
                    (self._vm_subscription(module) for module in self._vm_subscription_modules()), key=lambda s: s.name
                )
            ),
        )

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
        central_queue = m.body(self.central_queue_address)
        system_topic_address, system_topic = m.only("azurerm_eventgrid_system_topic")
        _, event_subscription = m.only("azurerm_eventgrid_system_topic_event_subscription")
        switch = _VARIABLE.findall(str(central_queue.get("count", "")) + str(m.local("central_count")))
        policy_address, policy = m.only("azapi_update_resource")
        if m.referenced(policy["resource_id"]) != self.vmss_address:
            raise TerraformSourceError(f"{policy_address} does not update the example scale set")
        event_grid = policy["body"]["properties"]["scheduledEventsPolicy"][
            "scheduledEventsAdditionalPublishingTargets"
        ]["eventGridAndResourceGraph"]
        delivery = _block(event_subscription, "delivery_identity")

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
            central_queue=self._name(self.central_queue_address),
            central_queue_max_delivery_count=int(m.value(central_queue.get("max_delivery_count", 0))),
            central_queue_dead_letter_on_expiration=(
                m.value(central_queue.get("dead_lettering_on_message_expiration")) is True
            ),
            central_system_topic_type=str(m.value(system_topic["topic_type"])),
            central_system_topic_location=str(m.value(system_topic["location"])),
            central_system_topic_source_is_subscription=(
                str(system_topic["source_arm_resource_id"]) == "/subscriptions/${local.subscription_id}"
                and m.local("subscription_id") == "${data.azurerm_client_config.current.subscription_id}"
            ),
            central_event_types=tuple(str(t) for t in event_subscription.get("included_event_types", [])),
            central_delivery_schema=str(m.value(event_subscription.get("event_delivery_schema", ""))),
            central_delivery_with_system_identity=(
                m.value(delivery.get("type")) == "SystemAssigned"
                and m.references(event_subscription["system_topic"]) == [system_topic_address]
                and m.references(event_subscription.get("service_bus_queue_endpoint_id"))
                == [self.central_queue_address]
            ),
            central_switch=switch[0] if len(set(switch)) == 1 else f"no single switch: {switch}",
            central_switch_default=m.variable_default(switch[0]) is True if switch else False,
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
            drainer_actions={method: self._drainer_actions(method) for method in DRAIN_METHODS},
            drain_method_default=str(m.variable_default("drain_method")),
            trust_resource_groups_default=self._joined_setting_default("MBRIDGE_TRUST_RESOURCE_GROUPS"),
            trust_subscriptions_default=self._joined_setting_default("MBRIDGE_TRUST_SUBSCRIPTIONS"),
            drainer_assignable_to_resource_group=self._assignable_to_resource_group(drainer),
            drain_without_virtual_network_refusal=self._drain_refusal(""),
            drain_with_virtual_network_refusal=self._drain_refusal(DRAIN_VIRTUAL_NETWORK),
            **self._telemetry(),
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
            vmss_event_grid_enable=str(event_grid["enable"]),
            vmss_event_grid_schema_version=str(event_grid["scheduledEventsApiVersion"]),
            vmss_event_grid_api_version=str(policy["type"]).rsplit("@", 1)[1],
            outputs=frozenset(m.outputs),
        )
