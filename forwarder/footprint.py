"""What the daemon does not load: measured weight with no use on a VM (docs/forwarder.md, "Footprint").

`skip_charset_detection()`: requests imports a character-set detector (charset_normalizer, ~3.5 MB of
RSS with its compiled tables) only to guess the encoding of a text body that declares none. Every
body the forwarder reads is JSON (UTF-8 by RFC 8259: IMDS, its token endpoint) or declares its
charset (Storage's XML); requests falls back to UTF-8 when no detector can be imported, which is
documented behaviour (`Response.apparent_encoding`). So `run` and `check` mark the detectors as
absent before requests is first imported. Other programs importing forwarder modules are unaffected.
"""

from __future__ import annotations

import sys
import warnings

DETECTORS = ("charset_normalizer", "chardet")


def skip_charset_detection() -> bool:
    """Make requests import without a charset detector. False (nothing done) if requests is loaded."""
    if "requests" in sys.modules:
        return False
    for name in DETECTORS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "import fails", by design
    # requests warns once at import that no detector is installed: expected here, not news.
    warnings.filterwarnings("ignore", message="Unable to find acceptable character detection dependency")
    return True
