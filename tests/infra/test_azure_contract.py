"""The Azure deployment, asserted once over both of its sources (Bicep and Terraform).

GIVEN the facts an extractor reads from infra/azure/ (Bicep) or infra/terraform/azure/
WHEN  they are compared with what docs/architecture.md, docs/contracts.md, docs/azure.md and docs/transports.md demand
THEN  both sources deploy the same entities, settings and least-privilege roles,
      in the queue mode (the default) and in the isolated (topic) mode.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from functions import telemetry
from functions.azure_app import settings as app_settings
from tests.infra.azure_facts import (
    AGENT,
    DEPLOYMENT_RESOURCE_GROUP,
    DEPLOYMENT_SUBSCRIPTION,
    DRAINER_ROLE,
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
    commands_subscription_scope,
    duration_seconds,
    vm_principal,
)
from tests.infra.bicep_facts import read as read_bicep
from tests.infra.bicep_facts import read_isolated as read_bicep_isolated
from tests.infra.terraform_azure_facts import read as read_terraform
from tests.infra.terraform_azure_facts import read_isolated as read_terraform_isolated

SOURCES: dict[str, Callable[[], AzureFacts]] = {
    "bicep": read_bicep,
    "terraform": read_terraform,
}


@pytest.fixture(params=sorted(SOURCES), scope="module")
def facts(request: pytest.FixtureRequest) -> AzureFacts:
    return SOURCES[request.param]()


def test_duration_parser() -> None:
    assert duration_seconds("PT10M") == 600
    assert duration_seconds("P1D") == 86400
    assert duration_seconds("PT1H30M15S") == 5415
    with pytest.raises(ValueError, match="not an ISO 8601 duration"):
        duration_seconds("10 minutes")


def test_service_bus_namespace_accepts_entra_id_only(facts: AzureFacts) -> None:
    assert facts.servicebus_sku in ("Standard", "Premium")  # Basic has no topics
    assert facts.servicebus_local_auth_disabled
    assert facts.servicebus_min_tls == "1.2"


def test_events_topic_drops_republished_envelopes(facts: AzureFacts) -> None:
    assert facts.events_topic == "maintenance-events"
    assert facts.events_duplicate_detection
    assert duration_seconds(facts.events_duplicate_window) >= 10 * 60


def test_function_subscription_retries_then_dead_letters(facts: AzureFacts) -> None:
    assert facts.function_subscription
    assert 5 <= facts.function_subscription_max_delivery_count <= 20
    assert facts.function_subscription_dead_letter_on_expiration
    # The host renews the lock for up to 10 minutes (host.json); the lock itself is at most 5.
    assert 60 <= duration_seconds(facts.function_subscription_lock) <= 300


def test_operator_results_subscription_sees_command_results_only(facts: AzureFacts) -> None:
    assert facts.operator_results_subscription == "operator-results"
    assert "org.maintenancebridge.command." in facts.operator_results_filter


def test_commands_queue_is_session_per_vm(facts: AzureFacts) -> None:
    assert facts.commands_queue == "maintenance-commands"
    assert facts.commands_requires_session
    assert duration_seconds(facts.commands_lock) >= 60  # the agent renews before each wait
    assert duration_seconds(facts.commands_ttl) == 10 * 60  # a command's default lifetime
    assert facts.commands_duplicate_detection  # MessageId = command_id
    assert facts.commands_max_delivery_count >= 5


def test_function_app_runs_python_311_on_linux_with_its_own_identity(facts: AzureFacts) -> None:
    assert facts.function_plan_sku in ("FC1", "Y1")
    assert facts.function_linux
    assert (facts.function_runtime, facts.function_runtime_version) == ("python", "3.11")
    assert facts.function_user_assigned_identity
    assert facts.function_https_only


def test_function_app_settings_are_identity_based(facts: AzureFacts) -> None:
    settings = facts.function_app_settings
    required = {
        "MBRIDGE_EVENTS_TOPIC",
        "MBRIDGE_EVENTS_SUBSCRIPTION",
        "MBRIDGE_COMMANDS_QUEUE",
        "MBRIDGE_SERVICEBUS__fullyQualifiedNamespace",
        "MBRIDGE_SERVICEBUS__credential",
        "MBRIDGE_SERVICEBUS__clientId",
        "MBRIDGE_TABLE_ENDPOINT",
        "MBRIDGE_STATE_TABLE",
        "MBRIDGE_AUDIT_TABLE",
        "AZURE_CLIENT_ID",
        "AzureWebJobsStorage__accountName",
        "AzureWebJobsStorage__credential",
        "AzureWebJobsStorage__clientId",
        "APPLICATIONINSIGHTS_CONNECTION_STRING",
        "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
        "MBRIDGE_SIGNING_KEY",
        "MBRIDGE_TRUST_SUBSCRIPTIONS",
        "MBRIDGE_TRUST_RESOURCE_GROUPS",
    }
    assert required <= settings.keys(), f"missing app settings: {sorted(required - settings.keys())}"
    assert settings["MBRIDGE_SERVICEBUS__credential"] == "managedidentity"
    assert settings["AzureWebJobsStorage__credential"] == "managedidentity"
    # No key to an Azure resource travels in an app setting: no SAS connection string, no account
    # key (the one secret is the command signing key, see below).
    assert "MBRIDGE_SERVICEBUS" not in settings
    assert "MBRIDGE_TABLE_CONNECTION_STRING" not in settings
    assert "AzureWebJobsStorage" not in settings
    for name, value in settings.items():
        assert "SharedAccessKey" not in value, name
        assert "AccountKey" not in value, name
    # The load balancer settings are wired (empty when no load balancer is given).
    assert {"MBRIDGE_LB_SUBSCRIPTION_ID", "MBRIDGE_LB_RESOURCE_GROUP", "MBRIDGE_LB_NAME"} <= settings.keys()


# Settings of settings.py that are not deployed: alternatives to what is (a key-based connection
# string), and trust settings whose defaults fit Azure's public cloud (docs/azure.md, "Trust").
NOT_DEPLOYED = {
    app_settings.SERVICEBUS_CONNECTION,
    app_settings.TABLE_CONNECTION_STRING,
    app_settings.TRUST_ROOTS,
    app_settings.TRUST_INTERMEDIATES,
    app_settings.TRUST_SIGNER_NAMES,
    # 60 s between two summaries of refused reports fits; refused without a webhook URL, it is set by hand
    app_settings.WEBHOOK_SUMMARY_SECONDS,
    # the autohealer check is on unless set false, for agents on the default health port
    app_settings.AUTOHEALER_CHECK,
    app_settings.AGENT_HEALTH_PORT,
    # the load balancer's probe is read unless set false (docs/policy.md#probe-aware-drains)
    app_settings.READ_PROBES,
}
# A trust file makes the function trust the keys written in it instead of Azure's: local runs only.
NEVER_DEPLOYED = {app_settings.TRUST_FILE}


def test_deployed_settings_are_the_ones_the_function_reads(facts: AzureFacts) -> None:
    # GIVEN the setting names settings.py defines, and the deployed settings
    defined = {
        value for name, value in vars(app_settings).items() if name.isupper() and str(value).startswith("MBRIDGE_")
    }
    deployed = facts.function_app_settings
    assert defined >= NOT_DEPLOYED | NEVER_DEPLOYED
    # THEN everything the app reads is deployed, except the alternatives and the defaults kept
    missing = defined - NOT_DEPLOYED - NEVER_DEPLOYED - deployed.keys()
    assert not missing, sorted(missing)
    assert not (NOT_DEPLOYED | NEVER_DEPLOYED) & deployed.keys()
    # AND no MBRIDGE_* setting is deployed that the app does not know (a typo would go unnoticed):
    # the only others are the sub-settings of the identity-based trigger connection
    unknown = {name for name in deployed if name.startswith("MBRIDGE_")} - defined
    assert all(name.startswith(f"{app_settings.SERVICEBUS_CONNECTION}__") for name in unknown), sorted(unknown)


def test_telemetry_is_one_switch_off_by_default(facts: AzureFacts) -> None:
    # GIVEN MBRIDGE_TELEMETRY, deployed from one parameter (variable) that takes what the app takes
    # on Azure (functions/telemetry), off by default (docs/operations.md#telemetry)
    assert TELEMETRY_SETTING == app_settings.TELEMETRY
    assert facts.function_app_settings[TELEMETRY_SETTING]
    assert facts.telemetry_switch
    assert facts.telemetry_allowed == (telemetry.OFF, telemetry.AZURE_MONITOR)
    assert facts.telemetry_default == telemetry.OFF
    # WHEN it is given each value THEN the app setting is that value
    assert facts.telemetry_setting == {value: value for value in facts.telemetry_allowed}
    # AND any other value stops the deployment, naming the parameter
    assert TELEMETRY_REFUSED not in facts.telemetry_allowed
    assert facts.telemetry_switch in facts.telemetry_refusal
    assert telemetry.AZURE_MONITOR in facts.telemetry_refusal
    # AND the grants are the same either way: the identity holds Monitoring Metrics Publisher on the
    # component with telemetry off too, since the Functions host sends its own logs there with it
    # (APPLICATIONINSIGHTS_AUTHENTICATION_STRING; the component takes Entra ID tokens only)
    assert facts.telemetry_grants[telemetry.OFF] == facts.telemetry_grants[telemetry.AZURE_MONITOR] == facts.grants
    assert RoleGrant(FUNCTION, "Monitoring Metrics Publisher", SCOPE_APP_INSIGHTS) in facts.grants
    assert facts.function_app_settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"]


def test_reports_are_trusted_from_the_deployments_subscription(facts: AzureFacts) -> None:
    # GIVEN policy trust attested (the default), which needs the subscriptions whose VMs may report;
    # THEN they are deployed, the deployment's own unless others are given
    assert facts.trust_subscriptions_default == (DEPLOYMENT_SUBSCRIPTION,)


def test_storage_takes_entra_id_only(facts: AzureFacts) -> None:
    assert facts.storage_shared_key_disabled
    assert facts.storage_min_tls == "TLS1_2"
    assert not facts.storage_public_blob_access
    assert facts.state_table == "mbridgestate"
    assert facts.audit_table == "mbridgeaudit"
    assert facts.app_insights_local_auth_disabled


EXPECTED_GRANTS = {
    # the function: its own subscription, the commands queue, its two tables, its host storage
    RoleGrant(FUNCTION, "Azure Service Bus Data Owner", SCOPE_FUNCTION_SUBSCRIPTION),
    RoleGrant(FUNCTION, "Azure Service Bus Data Sender", SCOPE_COMMANDS_QUEUE),
    RoleGrant(FUNCTION, "Storage Table Data Contributor", SCOPE_STATE_TABLE),
    RoleGrant(FUNCTION, "Storage Table Data Contributor", SCOPE_AUDIT_TABLE),
    RoleGrant(FUNCTION, "Storage Blob Data Owner", SCOPE_STORAGE_ACCOUNT),
    RoleGrant(FUNCTION, "Monitoring Metrics Publisher", SCOPE_APP_INSIGHTS),
    # the command signing key: that one Key Vault secret
    RoleGrant(FUNCTION, "Key Vault Secrets User", SCOPE_SIGNING_SECRET),
    # load-balancer membership changes, only where a drain writes
    RoleGrant(FUNCTION, DRAINER_ROLE, SCOPE_LOAD_BALANCER),
    RoleGrant(FUNCTION, DRAINER_ROLE, SCOPE_NIC_RESOURCE_GROUP),
    RoleGrant(FUNCTION, DRAINER_ROLE, SCOPE_VIRTUAL_NETWORK),
    # resolving an agent's attested vmId to its VM: read the VMs' resource groups
    RoleGrant(FUNCTION, "Reader", SCOPE_VM_RESOURCE_GROUPS),
    # the agents: publish events, receive their commands
    RoleGrant(AGENT, "Azure Service Bus Data Sender", SCOPE_EVENTS_TOPIC),
    RoleGrant(AGENT, "Azure Service Bus Data Receiver", SCOPE_COMMANDS_QUEUE),
    # the control plane's path: the system topic delivers into the central queue, the function reads it
    RoleGrant(SYSTEM_TOPIC, "Azure Service Bus Data Sender", SCOPE_CENTRAL_QUEUE),
    RoleGrant(FUNCTION, "Azure Service Bus Data Receiver", SCOPE_CENTRAL_QUEUE),
}


def test_roles_are_assigned_on_the_narrowest_scope(facts: AzureFacts) -> None:
    assert facts.grants == EXPECTED_GRANTS


def test_the_trigger_may_read_its_subscriptions_message_count_and_nothing_more(facts: AzureFacts) -> None:
    # GIVEN the Service Bus grants of the function app
    service_bus = {grant for grant in facts.grants if grant.role.startswith("Azure Service Bus")}
    # THEN the trigger holds Data Owner on its own subscription: the scale controller reads the
    # subscription's message count to scale to the backlog (target-based scaling needs Manage rights;
    # with Data Receiver's Listen only it scales one instance at a time, docs/azure.md)
    owners = {grant for grant in service_bus if grant.role == "Azure Service Bus Data Owner"}
    assert owners == {RoleGrant(FUNCTION, "Azure Service Bus Data Owner", SCOPE_FUNCTION_SUBSCRIPTION)}
    # AND the function receives nowhere else but the control plane's queue (Data Owner on its
    # subscription covers receiving there)
    receivers = {g for g in service_bus if g.principal == FUNCTION and g.role == "Azure Service Bus Data Receiver"}
    assert receivers == {RoleGrant(FUNCTION, "Azure Service Bus Data Receiver", SCOPE_CENTRAL_QUEUE)}


# ---------------------------------------------------------------- the control plane's path

SCHEDULED_EVENT_EMITTED = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"


def test_the_subscriptions_scheduled_events_reach_the_central_queue(facts: AzureFacts) -> None:
    # GIVEN the Event Grid system topic of the subscription's Scheduled Events (docs/azure.md, "The
    # control plane's reports")
    assert facts.central_system_topic_type == "Microsoft.ResourceNotifications.MaintenanceResources"
    assert facts.central_system_topic_location == "global"
    assert facts.central_system_topic_source_is_subscription
    # THEN its subscription delivers ScheduledEventEmitted, and nothing else, in the Event Grid schema
    assert facts.central_event_types == (SCHEDULED_EVENT_EMITTED,)
    assert facts.central_delivery_schema == "EventGridSchema"
    # AND it delivers into the queue the function reads (MBRIDGE_CENTRAL_QUEUE), with the topic's own
    # identity: no key on the path
    assert facts.central_delivery_with_system_identity
    assert facts.central_queue == "maintenance-central"


def test_the_central_queue_redelivers_then_dead_letters(facts: AzureFacts) -> None:
    # As the function's events subscription: retried, then kept in the dead-letter queue
    assert facts.central_queue_max_delivery_count == facts.function_subscription_max_delivery_count
    assert facts.central_queue_dead_letter_on_expiration


def test_only_the_system_topic_may_put_a_report_on_the_central_queue(facts: AzureFacts) -> None:
    # GIVEN every grant on the central queue (docs/security.md, "Reports from the control plane")
    on_queue = {grant for grant in facts.grants if grant.scope == SCOPE_CENTRAL_QUEUE}
    # THEN the system topic's identity is its one sender, the function its one receiver, and nobody
    # holds more there
    assert on_queue == {
        RoleGrant(SYSTEM_TOPIC, "Azure Service Bus Data Sender", SCOPE_CENTRAL_QUEUE),
        RoleGrant(FUNCTION, "Azure Service Bus Data Receiver", SCOPE_CENTRAL_QUEUE),
    }
    # AND the system topic's identity holds nothing anywhere else
    assert {grant for grant in facts.grants if grant.principal == SYSTEM_TOPIC} == {
        RoleGrant(SYSTEM_TOPIC, "Azure Service Bus Data Sender", SCOPE_CENTRAL_QUEUE)
    }


def test_the_app_reads_the_central_queue_and_resource_graph_with_its_trust_scope(facts: AzureFacts) -> None:
    settings = facts.function_app_settings
    # GIVEN the central path switched on; THEN the app is told the queue and to read Resource Graph
    assert "MBRIDGE_CENTRAL_QUEUE" in settings
    assert facts.central_switch in settings["MBRIDGE_CENTRAL_QUEUE"]
    assert "MBRIDGE_CENTRAL_RECONCILE" in settings
    # AND the subscriptions it may concern, without which the app refuses the queue (settings.py)
    assert settings["MBRIDGE_TRUST_SUBSCRIPTIONS"]
    # AND Resource Graph is read with the Reader it already holds on the VMs' resource groups: the
    # rows of a VM's Scheduled Events are under its resource group; nothing is granted on the
    # subscription (docs/azure.md, "The control plane's reports")
    assert {grant for grant in facts.grants if grant.role == "Reader"} == {
        RoleGrant(FUNCTION, "Reader", SCOPE_VM_RESOURCE_GROUPS)
    }


def test_the_central_path_is_one_switch_on_by_default(facts: AzureFacts) -> None:
    # A Microsoft preview that needs two registered features (docs/deploy.md): one parameter
    # (variable) turns all of it off, and it is on unless set so
    assert facts.central_switch in ("centralReports", "central_reports")
    assert facts.central_switch_default is True


def test_the_scale_set_publishes_its_scheduled_events_to_event_grid(facts: AzureFacts) -> None:
    # scheduledEventsPolicy needs the Compute API 2025-04-01 or later; during the preview the only
    # schema version is 2020-07-01 (Microsoft's "Scheduled Events in Event Grid" page)
    assert facts.vmss_event_grid_api_version >= "2025-04-01"
    assert facts.vmss_event_grid_schema_version == "2020-07-01"
    # AND it follows the same switch
    assert facts.central_switch in facts.vmss_event_grid_enable


def test_a_drain_without_the_virtual_network_of_its_vms_is_refused(facts: AzureFacts) -> None:
    # GIVEN a drain load balancer and no virtual network: every NIC write is checked for
    # Microsoft.Network/virtualNetworks/subnets/join/action on the NIC's subnet, so without the drainer
    # role on the virtual network every drain would fail
    # THEN the deployment is refused (Bicep: modules/check.bicep; Terraform: a precondition), naming
    # the input to set
    refusal = facts.drain_without_virtual_network_refusal
    assert refusal
    assert "drainvirtualnetworkname" in refusal.replace("_", "").lower()
    assert "subnet" in refusal
    # AND with the virtual network given, it goes ahead
    assert facts.drain_with_virtual_network_refusal == ""


def test_the_function_reads_the_vms_resource_groups_only(facts: AzureFacts) -> None:
    # GIVEN the Reader grants, which the VM directory needs to resolve an attested vmId
    readers = {grant for grant in facts.grants if grant.role == "Reader"}
    # THEN the function alone holds Reader, once per resource group that MBRIDGE_TRUST_RESOURCE_GROUPS
    # names, assigned in that group: never on the subscription, never on anything else
    assert readers == {RoleGrant(FUNCTION, "Reader", SCOPE_VM_RESOURCE_GROUPS)}
    # AND without resource groups given, that is the deployment's own
    assert facts.trust_resource_groups_default == (DEPLOYMENT_RESOURCE_GROUP,)
    # AND no other role is granted on a resource group but the drainer on the NICs' one
    assert {grant.scope for grant in facts.grants if grant.scope.startswith(("resource group", "scope"))} == set()


def test_every_command_is_signed_with_a_key_from_key_vault(facts: AzureFacts) -> None:
    # GIVEN the function app's settings; THEN a signing key is always deployed: the agents run no
    # unsigned command, and refuse to start without the public key
    setting = facts.function_app_settings["MBRIDGE_SIGNING_KEY"]
    # AND the setting holds a Key Vault reference, never the key: reading the app's settings does
    # not give the key away
    assert setting.startswith("@Microsoft.KeyVault("), setting
    assert setting.endswith(")"), setting
    assert "${" in setting, "the reference must name the deployment's own secret"
    # AND the function identity may read that secret, and nothing else in a vault
    readers = {grant for grant in facts.grants if grant.role.startswith("Key Vault")}
    assert readers == {RoleGrant(FUNCTION, "Key Vault Secrets User", SCOPE_SIGNING_SECRET)}


ADMIN_STATE_ACTIONS = {
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Network/loadBalancers/read",
    "Microsoft.Network/loadBalancers/backendAddressPools/read",
    "Microsoft.Network/loadBalancers/backendAddressPools/write",
    "Microsoft.Network/virtualNetworks/joinLoadBalancer/action",
}


def test_drainer_role_by_admin_state_writes_backend_pools_and_no_nic(facts: AzureFacts) -> None:
    # GIVEN the default drain method, admin state (docs/azure.md, "Admin state or pool edits")
    assert facts.drain_method_default == "admin-state"
    assert facts.function_app_settings["MBRIDGE_LB_DRAIN"]
    # THEN the role reads the load balancer, its pools and the NICs, and writes pools only: no NIC
    # write and none of the joins a NIC write is checked for
    assert facts.drainer_actions["admin-state"] == ADMIN_STATE_ACTIONS
    assert facts.drainer_assignable_to_resource_group


def test_drainer_role_by_pool_edits_allows_membership_changes_only(facts: AzureFacts) -> None:
    assert facts.drainer_actions["pool-edit"] == ADMIN_STATE_ACTIONS | {
        "Microsoft.Network/networkInterfaces/write",
        "Microsoft.Network/loadBalancers/backendAddressPools/join/action",
        "Microsoft.Network/virtualNetworks/subnets/join/action",
        # a NIC write is checked for the join of everything the NIC links to: without these, the
        # first drain of a VM whose NIC has an NSG (every portal-made VM) fails with
        # LinkedAuthorizationFailed
        "Microsoft.Network/networkSecurityGroups/join/action",
        "Microsoft.Network/publicIPAddresses/join/action",
        "Microsoft.Network/applicationSecurityGroups/joinIpConfiguration/action",
        "Microsoft.Network/loadBalancers/inboundNatRules/join/action",
    }
    assert not any("*" in action for actions in facts.drainer_actions.values() for action in actions)


def test_scale_set_gets_terminate_notifications_within_bounds(facts: AzureFacts) -> None:
    assert facts.vmss_terminate_notification_enabled
    assert facts.vmss_not_before_parameter
    assert facts.not_before_allowed == tuple(f"PT{minutes}M" for minutes in range(5, 16))
    assert facts.not_before_default in facts.not_before_allowed


def test_scale_set_runs_the_agent(facts: AzureFacts) -> None:
    assert facts.vmss_uses_agent_identity
    assert facts.vmss_custom_data_from_cloud_init
    assert (facts.vmss_health_probe_path, facts.vmss_health_probe_port) == ("/readyz", 9797)


def test_outputs_give_what_agents_and_operators_need(facts: AzureFacts) -> None:
    assert {
        "servicebus_namespace_fqdn",
        "events_topic",
        "commands_queue",
        "commands_topic",
        "commands_subscriptions",
        "function_app_name",
        "agent_identity_client_id",
        "agent_identity_id",
        "table_endpoint",
        "audit_table",
    } <= facts.outputs


# ---------------------------------------------------------------- the isolated (topic) mode

# Two standalone VMs, each with its own managed identity (principal ids as a deployment gives them).
ISOLATED_VMS = {
    "web-0": "11111111-1111-4111-8111-111111111111",
    "db-1": "22222222-2222-4222-8222-222222222222",
}

ISOLATED_SOURCES: dict[str, Callable[[], IsolatedCommandsFacts]] = {
    "bicep": lambda: read_bicep_isolated(ISOLATED_VMS),
    "terraform": lambda: read_terraform_isolated(ISOLATED_VMS),
}


@pytest.fixture(params=sorted(ISOLATED_SOURCES), scope="module")
def isolated(request: pytest.FixtureRequest) -> IsolatedCommandsFacts:
    return ISOLATED_SOURCES[request.param]()


def test_the_topic_mode_sends_commands_through_a_topic_instead_of_the_queue(isolated: IsolatedCommandsFacts) -> None:
    assert isolated.commands_topic == "maintenance-commands"
    assert not isolated.commands_queue_deployed
    assert isolated.commands_topic_duplicate_detection  # MessageId = command_id: a re-sent command is dropped
    assert duration_seconds(isolated.commands_topic_duplicate_window) >= 10 * 60
    assert duration_seconds(isolated.commands_topic_ttl) == 10 * 60  # a command's default lifetime
    assert not isolated.commands_topic_partitioned  # one VM's commands in sequence
    # AND the function app sends there, in the topic mode
    settings = isolated.function_app_settings
    assert settings["MBRIDGE_COMMANDS_MODE"] == "topic"
    assert settings["MBRIDGE_COMMANDS_TOPIC"] == isolated.commands_topic
    assert settings["MBRIDGE_COMMANDS_QUEUE"] == ""


def test_each_vm_subscription_passes_only_its_own_vms_commands(isolated: IsolatedCommandsFacts) -> None:
    assert [subscription.name for subscription in isolated.subscriptions] == sorted(f"vm-{vm}" for vm in ISOLATED_VMS)
    for subscription in isolated.subscriptions:
        vm = subscription.name.removeprefix("vm-")
        assert subscription.topic == isolated.commands_topic
        # The filter names this VM and nothing else, and no TrueFilter `$Default` lets the rest in
        assert subscription.filters == {f"target = '{vm}'"}
        assert not subscription.default_rule_kept
        # One reader, no sessions; a lock the agent can settle within; commands expire as on the queue
        assert not subscription.requires_session
        assert 30 <= duration_seconds(subscription.lock) <= 300
        assert duration_seconds(subscription.ttl) == 10 * 60
        assert subscription.max_delivery_count >= 5


EXPECTED_ISOLATED_GRANTS = (
    EXPECTED_GRANTS
    - {
        RoleGrant(FUNCTION, "Azure Service Bus Data Sender", SCOPE_COMMANDS_QUEUE),
        RoleGrant(AGENT, "Azure Service Bus Data Receiver", SCOPE_COMMANDS_QUEUE),
    }
    | {RoleGrant(FUNCTION, "Azure Service Bus Data Sender", SCOPE_COMMANDS_TOPIC)}
    | {
        grant
        for vm, principal in ISOLATED_VMS.items()
        for grant in (
            # each VM's own identity: its own subscription, and the events topic it publishes to
            RoleGrant(
                vm_principal(principal), "Azure Service Bus Data Receiver", commands_subscription_scope(f"vm-{vm}")
            ),
            RoleGrant(vm_principal(principal), "Azure Service Bus Data Sender", SCOPE_EVENTS_TOPIC),
        )
    }
)


def test_in_the_topic_mode_each_vm_may_receive_from_its_own_subscription_only(isolated: IsolatedCommandsFacts) -> None:
    assert isolated.grants == EXPECTED_ISOLATED_GRANTS
    # Spelled out: no agent identity, shared or a VM's own, holds a role on the commands topic or on
    # anything namespace-wide, and a VM's receiver role names its own subscription and no other
    for grant in isolated.grants:
        if grant.principal in (FUNCTION, SYSTEM_TOPIC):
            continue
        assert grant.scope != SCOPE_COMMANDS_TOPIC, grant
        if grant.role == "Azure Service Bus Data Receiver":
            [vm] = [vm for vm, principal in ISOLATED_VMS.items() if vm_principal(principal) == grant.principal]
            assert grant.scope == commands_subscription_scope(f"vm-{vm}"), grant
        else:
            assert (grant.role, grant.scope) == ("Azure Service Bus Data Sender", SCOPE_EVENTS_TOPIC), grant


def test_the_topic_mode_deploys_no_scale_set(isolated: IsolatedCommandsFacts) -> None:
    # A scale set's VMs share one identity: it stays on the queue mode
    assert not isolated.example_scale_set_deployed
