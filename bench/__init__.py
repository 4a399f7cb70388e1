"""Benchmarks of maintenance-bridge: `python -m bench [--quick] --out FILE.json` (see docs/performance.md)."""
