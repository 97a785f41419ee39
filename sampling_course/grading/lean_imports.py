"""``import_jsonschema``: the ``jsonschema`` package without the optional import it never needs here.

When ``rfc3987_syntax`` is installed (Jupyter's server brings it, through
``jsonschema[format-nongpl]``), importing ``jsonschema`` imports it too, for the ``"iri"``
string format, and that import compiles a Lark grammar: about 2.5 s on an idle 2-core machine,
three times that under load, in every check of part 8's JSON mode and every ``nbformat`` import.
No test here checks string formats (``jsonschema.validate`` treats ``format`` as an annotation
unless given a format checker), so ``jsonschema`` is imported as if that package were absent;
afterwards ``import rfc3987_syntax`` works as before.
"""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["import_jsonschema"]

SKIPPED = "rfc3987_syntax"


def import_jsonschema() -> ModuleType:
    """``import jsonschema``, skipping its optional ``rfc3987_syntax`` import (see the module's docstring).

    A no-op beyond the import when ``jsonschema`` or ``rfc3987_syntax`` is already imported."""
    if "jsonschema" not in sys.modules and SKIPPED not in sys.modules:
        sys.modules[SKIPPED] = None  # ``import rfc3987_syntax`` raises ImportError, which jsonschema expects
        try:
            import jsonschema  # noqa: F401
        finally:
            if sys.modules.get(SKIPPED, ...) is None:
                del sys.modules[SKIPPED]
    import jsonschema

    return jsonschema
