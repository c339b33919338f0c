"""The entry points' logging set-up: rich only for a terminal (``shoal server`` starts
without importing it), plain lines otherwise. Each case in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = """
import logging, sys
from shoal._internal.logconfig import configure
configure(logging.INFO)
[handler] = logging.getLogger("shoal").handlers
print(type(handler).__name__, "rich" in sys.modules)
"""


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "StreamHandler False"),  # stderr is a pipe here
    ({"FORCE_COLOR": "1"}, "RichHandler True"),  # rich is told it is a terminal
    ({"TTY_COMPATIBLE": "0"}, "StreamHandler True"),  # rich asked, and it says no
])
def test_rich_is_imported_only_when_stderr_may_be_a_terminal(env, expected):
    base = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    done = subprocess.run([sys.executable, "-c", _PROBE], env={**base, **env},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
