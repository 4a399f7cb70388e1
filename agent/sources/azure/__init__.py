"""Azure IMDS: the Scheduled Events client and poller, the document parser, the diff, the tracker
and the `Source`."""
