"""Cloud-agnostic core shared by the agent and the function apps (standard library only)."""
