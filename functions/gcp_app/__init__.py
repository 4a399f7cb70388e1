"""The Google Cloud Functions (gen2) app: a Pub/Sub-triggered entry point over functions.core,
with Firestore state and audit, Compute Engine instance groups and performMaintenance, and
Pub/Sub commands. See docs/gcp.md."""
