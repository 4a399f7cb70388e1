"""The control plane's feeds read into `CentralReport`s (functions/core/central.py): Azure Scheduled
Events from Event Grid (and Resource Graph rows), GCE `upcomingMaintenance` from the Compute API.

Pure parsing and scope checks, no SDK and no app: the cloud apps and the local app (which reads the
simulator's feed) share them.
"""
