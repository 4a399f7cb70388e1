"""The installed release of maintenance-bridge: what `mbridge --version`, the agent's start-up log,
its /healthz and mbridge_build_info, and the functions' logs report.

Read from the installed distribution's metadata, so a wheel, an editable install and a function
package built from the same tree agree. A tree that was never installed (the function zips run
from their unpacked sources) reports "unknown" rather than guess.
"""

from __future__ import annotations

from functools import lru_cache

DISTRIBUTION = "maintenance-bridge"
UNKNOWN = "unknown"


@lru_cache(maxsize=1)
def version() -> str:
    """The release, e.g. "0.1.0"; "unknown" when the distribution is not installed."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN
