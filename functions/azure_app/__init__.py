"""The Azure Functions app (Python v2 model): a Service Bus topic trigger over the function core.

`blueprint` declares the trigger, `settings` reads the app settings once, `wiring` builds the core's
ports on Azure services: Table Storage (`tables`), Azure Load Balancer backend pools
(`load_balancer`) and the Service Bus commands queue (`commands`). docs/azure.md describes the
settings and the roles each adapter needs.
"""
