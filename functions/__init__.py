"""Cloud-side handlers of maintenance events: one core, thin Azure, GCP and local apps."""
