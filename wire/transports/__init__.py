"""Buses the agent publishes to and receives commands from. Each SDK is imported only by
the module of the transport that was chosen."""
