"""What the agent's process leaves out of memory before it imports anything else.

`requests` (the HTTP of the Azure and Google SDKs behind the bus transports, and of anything
else that imports it) imports a character-set detector when it is installed, `charset_normalizer`
(or `chardet`): 2.6 MB of compiled tables resident in every agent that loads requests
(docs/performance.md, the import table). It serves only `Response.text` on a body that declares
no charset, which the SDKs' JSON and the token endpoints do declare. requests supports running
without a detector: it then decodes such a body as UTF-8.

So `mbridge agent` marks both modules as absent (a None in sys.modules makes an import of them
raise ImportError, which requests catches) before requests is first imported. Only the agent's
process does this: tests, the demo and the functions import the detector as usual.
"""

from __future__ import annotations

import sys
import warnings

LEFT_OUT = ("charset_normalizer", "chardet")


def leave_out_unused_modules() -> None:
    for name in LEFT_OUT:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]  # the documented way to block an import
    # requests says once, at import, that it found no detector: expected here, not worth a line in the log.
    warnings.filterwarnings("ignore", message="Unable to find acceptable character detection", module="requests")
