"""What the agent and the function apps both speak: the event model, the CloudEvents envelope,
proofs' digest, commands and their signatures, errors, JSON and time parsing, size bounds, and the
bus transports (`wire.transports`). Standard library only, but cryptography for keys and each
transport's own SDK."""
