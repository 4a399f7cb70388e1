"""What the Azure deployment must be, as facts read from either of its two sources.

The Bicep (`infra/azure/`) and the Terraform (`infra/terraform/azure/`) deploy the same thing.
Each has an extractor (`bicep_facts.py`, `terraform_azure_facts.py`) that reads its source into
one `AzureFacts`; `test_azure_contract.py` runs the same assertions over both.

Durations are ISO 8601 as Azure takes them (`PT10M`, `P1D`) and compared in seconds.
Role grants name the principal by its part in the system and the scope by the resource it is
assigned on, so that the assertions read the same for both sources.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# Principals
FUNCTION = "function"  # the function app's user-assigned identity
AGENT = "agent"  # the VMs' user-assigned identity (the agents)
# The system-assigned identity of the Event Grid system topic of the subscription's Scheduled Events
# (the control plane's path), which delivers them into the central queue.
SYSTEM_TOPIC = "system topic"

# Scopes a role assignment may name. Anything broader (the namespace, a resource group other
# than the NICs' one, the subscription) is not in this list on purpose.
SCOPE_EVENTS_TOPIC = "events_topic"
SCOPE_FUNCTION_SUBSCRIPTION = "function_subscription"
SCOPE_COMMANDS_QUEUE = "commands_queue"
SCOPE_COMMANDS_TOPIC = "commands_topic"  # the isolated mode's topic
SCOPE_CENTRAL_QUEUE = "central_queue"  # the queue of the control plane's reports (MBRIDGE_CENTRAL_QUEUE)
SCOPE_STATE_TABLE = "state_table"
SCOPE_AUDIT_TABLE = "audit_table"
SCOPE_STORAGE_ACCOUNT = "storage_account"  # the Functions host's own storage (leases, deployment package)
SCOPE_APP_INSIGHTS = "app_insights"
SCOPE_SIGNING_SECRET = "signing_secret"  # noqa: S105 (a scope name): the Key Vault secret MBRIDGE_SIGNING_KEY refers to
SCOPE_LOAD_BALANCER = "load_balancer"
SCOPE_NIC_RESOURCE_GROUP = "nic_resource_group"
SCOPE_VIRTUAL_NETWORK = "virtual_network"
# Each resource group of MBRIDGE_TRUST_RESOURCE_GROUPS: a role assigned once per group of the list
# the setting is written from, in that group (never the subscription).
SCOPE_VM_RESOURCE_GROUPS = "vm_resource_groups"
# What a list of resource groups (subscriptions) defaults to: the one the deployment goes into.
DEPLOYMENT_RESOURCE_GROUP = "(the deployment's resource group)"
DEPLOYMENT_SUBSCRIPTION = "(the deployment's subscription)"

DRAINER_ROLE = "Maintenance Bridge Drainer"


def commands_entity_scope(scope: str, shard: int) -> str:
    """The scope of the commands queue or topic (SCOPE_COMMANDS_QUEUE, SCOPE_COMMANDS_TOPIC) of one
    shard: shard 0 is the entity itself, shard k `maintenance-commands-<k>` (wire/shards.py)."""
    return scope if shard == 0 else f"{scope}[{shard}]"


def commands_subscription_scope(subscription: str, shard: int = 0) -> str:
    """The scope of one VM's subscription of the commands topic of its shard (the isolated mode)."""
    return f"{commands_entity_scope(SCOPE_COMMANDS_TOPIC, shard)}/subscriptions/{subscription}"


def vm_principal(principal_id: str) -> str:
    """A VM's own identity, by the principal id the deployment is given for it (the isolated mode)."""
    return f"vm identity {principal_id}"


@dataclass(frozen=True)
class RoleGrant:
    principal: str  # FUNCTION, AGENT or SYSTEM_TOPIC
    role: str  # the built-in role's name, or DRAINER_ROLE
    scope: str  # one of the SCOPE_* names


@dataclass(frozen=True)
class AzureFacts:
    # Service Bus
    servicebus_sku: str  # "Standard" or "Premium"
    servicebus_local_auth_disabled: bool  # no SAS keys: Entra ID only
    servicebus_min_tls: str  # "1.2"
    events_topic: str
    events_duplicate_detection: bool
    events_duplicate_window: str  # ISO 8601 duration
    function_subscription: str
    function_subscription_max_delivery_count: int
    function_subscription_dead_letter_on_expiration: bool
    function_subscription_lock: str  # ISO 8601 duration
    operator_results_subscription: str
    operator_results_filter: str  # the SQL filter text
    commands_queue: str
    commands_requires_session: bool
    commands_lock: str  # ISO 8601 duration
    commands_ttl: str  # ISO 8601 duration (default message time to live)
    commands_duplicate_detection: bool
    commands_max_delivery_count: int
    # The control plane's path (Event Grid system topic -> central queue)
    central_queue: str
    central_queue_max_delivery_count: int
    central_queue_dead_letter_on_expiration: bool
    central_system_topic_type: str
    central_system_topic_location: str
    central_system_topic_source_is_subscription: bool
    central_event_types: tuple[str, ...]  # the event subscription's included event types
    central_delivery_schema: str
    central_delivery_with_system_identity: bool  # delivered with the system topic's own identity
    central_switch: str  # the parameter/variable that turns the whole path off
    central_switch_default: bool
    # Function app
    function_plan_sku: str  # "FC1" (Flex Consumption) or "Y1" (Consumption)
    function_linux: bool
    function_runtime: str  # "python"
    function_runtime_version: str  # "3.11"
    function_user_assigned_identity: bool
    function_https_only: bool
    function_app_settings: dict[str, str]  # name -> the value's source text (literal or expression)
    state_table: str
    audit_table: str
    storage_shared_key_disabled: bool
    storage_min_tls: str  # "TLS1_2"
    storage_public_blob_access: bool
    app_insights_local_auth_disabled: bool
    # Identities and roles
    grants: frozenset[RoleGrant]
    # The drainer role's actions for each drain method (MBRIDGE_LB_DRAIN), the default one included.
    drainer_actions: Mapping[str, frozenset[str]]
    drain_method_default: str
    # MBRIDGE_TRUST_RESOURCE_GROUPS (and the Reader grants on them) when nothing is given:
    # DEPLOYMENT_RESOURCE_GROUP, or the names written in the source.
    trust_resource_groups_default: tuple[str, ...]
    # MBRIDGE_TRUST_SUBSCRIPTIONS when nothing is given: DEPLOYMENT_SUBSCRIPTION, or the ids written.
    trust_subscriptions_default: tuple[str, ...]
    drainer_assignable_to_resource_group: bool  # assignable scopes limited to the resource group
    # What the deployment says when it is refused for a drain load balancer given without the virtual
    # network of its VMs ("" when it goes ahead), and the same with one ("" expected): every NIC write
    # is checked for subnets/join on that network, so without the drainer role there every drain fails.
    drain_without_virtual_network_refusal: str
    drain_with_virtual_network_refusal: str
    # MBRIDGE_TELEMETRY: the parameter/variable it is deployed from, every value that one accepts,
    # its default; the setting and the role grants deployed with each accepted value (value ->);
    # what the deployment says when given TELEMETRY_REFUSED ("" when it goes ahead)
    telemetry_switch: str
    telemetry_allowed: tuple[str, ...]
    telemetry_default: str
    telemetry_setting: Mapping[str, str]
    telemetry_grants: Mapping[str, frozenset[RoleGrant]]
    telemetry_refusal: str
    # VM scale set example
    vmss_terminate_notification_enabled: bool
    vmss_not_before_parameter: str  # the parameter/variable that sets notBeforeTimeout
    not_before_allowed: tuple[str, ...]  # every value the parameter accepts, e.g. ("PT5M", ..., "PT15M")
    not_before_default: str
    vmss_uses_agent_identity: bool
    vmss_custom_data_from_cloud_init: bool  # custom data built from infra/agent/cloud-init.yaml
    vmss_health_probe_path: str  # "/readyz"
    vmss_health_probe_port: int  # 9797
    # scheduledEventsPolicy.scheduledEventsAdditionalPublishingTargets.eventGridAndResourceGraph
    # of the scale set: `enable` as the source writes it (the switch), its schema version, and the
    # Compute API version it is written with
    vmss_event_grid_enable: str
    vmss_event_grid_schema_version: str
    vmss_event_grid_api_version: str
    # Interface
    outputs: frozenset[str]


# The drain target the refusal facts are read with (names of the shared contract, spelled per source).
DRAIN_LOAD_BALANCER = "lb-web"
DRAIN_VIRTUAL_NETWORK = "vnet-web"
# MBRIDGE_LB_DRAIN's values (functions/azure_app/settings.py), each a drainer role of its own.
DRAIN_METHODS = ("admin-state", "pool-edit")
# The app setting of the functions' telemetry (functions/telemetry), and the value its refusal fact
# is read with: another cloud's exporter.
TELEMETRY_SETTING = "MBRIDGE_TELEMETRY"
TELEMETRY_REFUSED = "gcp"


@dataclass(frozen=True)
class VmCommandsSubscription:
    """One VM's subscription of the commands topic (the module vm-commands-subscription)."""

    name: str
    topic: str  # the name of the topic it is a subscription of
    filters: frozenset[str]  # each rule's filter: "target = 'web-0'" (correlation) or the SQL text
    default_rule_kept: bool  # the `$Default` TrueFilter left in place (it passes every message)
    requires_session: bool
    lock: str  # ISO 8601 duration
    ttl: str  # ISO 8601 duration (default message time to live)
    max_delivery_count: int


@dataclass(frozen=True)
class IsolatedCommandsFacts:
    """The deployment in the isolated mode (commands mode `topic`), with a given set of VMs."""

    commands_topic: str
    commands_topic_duplicate_detection: bool
    commands_topic_duplicate_window: str  # ISO 8601 duration
    commands_topic_ttl: str  # ISO 8601 duration
    commands_topic_partitioned: bool
    commands_queue_deployed: bool
    example_scale_set_deployed: bool
    function_app_settings: dict[str, str]  # name -> value (literal, or the source text of an expression)
    grants: frozenset[RoleGrant]
    subscriptions: tuple[VmCommandsSubscription, ...]  # by name


_DURATION = re.compile(r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?$")


def duration_seconds(value: str) -> int:
    """Seconds of an ISO 8601 duration as Azure writes them (`P1D`, `PT10M`, `PT1H30M`, `PT45S`)."""
    match = _DURATION.match(value)
    if not match or value in ("P", "PT"):
        raise ValueError(f"not an ISO 8601 duration: {value!r}")
    parts = {k: int(v) if v else 0 for k, v in match.groupdict().items()}
    return parts["d"] * 86400 + parts["h"] * 3600 + parts["m"] * 60 + parts["s"]
