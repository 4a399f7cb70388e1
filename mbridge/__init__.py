"""The `mbridge` command line and the tools built on every layer: the demo, `mbridge approve`
and `mbridge audit`."""
