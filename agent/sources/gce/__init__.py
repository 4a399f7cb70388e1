"""GCE metadata: the long-poll client, the value parsers, the diff, the tracker and the `Source`."""
