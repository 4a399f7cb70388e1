"""The Compute API stand-in's fixture (tests/contract/gcp/test_compute.py), for every module here."""

from tests.contract.gcp.test_compute import compute

__all__ = ["compute"]
