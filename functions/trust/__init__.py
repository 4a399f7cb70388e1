"""Verification of cloud-issued identity proofs."""
