"""``import_jsonschema``: jsonschema without its slow optional import, everything else as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import importlib.util, sys
from sampling_course.grading.lean_imports import import_jsonschema
jsonschema = import_jsonschema()
print("skipped", "rfc3987_syntax" not in sys.modules)
print("valid", jsonschema.Draft202012Validator({"type": "string", "maxLength": 2}).is_valid("ab"),
      jsonschema.Draft202012Validator({"type": "string", "maxLength": 2}).is_valid("abc"))
if importlib.util.find_spec("rfc3987_syntax") is not None:
    import rfc3987_syntax  # still importable afterwards
print("importable", "rfc3987_syntax" not in sys.modules or sys.modules["rfc3987_syntax"] is not None)
"""


@pytest.mark.slow
def test_jsonschema_validates_without_importing_rfc3987_syntax_which_stays_importable():
    # A fresh interpreter: this one may have imported jsonschema already.
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["skipped", "True", "valid", "True", "False", "importable", "True"], out
