"""The in-VM agent: watches the metadata service and forwards maintenance notices."""
