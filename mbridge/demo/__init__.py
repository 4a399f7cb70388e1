"""`mbridge demo`: the whole product on one machine, with every expectation checked.

Metadata simulators for an Azure availability set of three VMs, a Spot VM, a scale-set instance
and a GCE VM; one real agent per VM; a bus (the embedded SQLite bus, or Google's Pub/Sub
emulator); the functions (the local function host, or the Cloud Functions entry served by
functions-framework); then the maintenance flows of `flows/` played time-scaled, each watched
stage by stage and checked against what the default policy promises (docs/policy.md).

- `flows/`: the flows, what each injects into the simulator and what it must lead to (one module a
  phase, the checks, the model).
- `timeline.py`: the stages each event went through, when, from the bus, the audit log and the
  simulator's approval log.
- `world.py` / `pubsub_world.py`: the two backbones (embedded; Pub/Sub emulator); the Google one
  with its bus (`pubsub_bus.py`), function (`pubsub_function.py`), Eventarc stand-in
  (`eventarc_shim.py`) and watch (`pubsub_watch.py`).
- `play.py`: plays the flows on a world, phase by phase, and decides the exit code.
- `report.py`: the live lines, the summary table and the HTML page.
"""
