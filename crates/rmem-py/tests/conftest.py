"""Helpers the test modules share (pytest puts this directory on sys.path)."""

import os
import subprocess
import sys
import textwrap


def run_py(code, *args, user=None, timeout=120, env=None):
    """Run `code` (with `args` as sys.argv[1:]) in a fresh interpreter (this one, so the same
    rmem), optionally as `user`; bounded by `timeout` seconds."""
    cmd = [sys.executable, "-c", textwrap.dedent(code), *args]
    if user is not None:
        cmd = ["runuser", "-u", user, "--"] + cmd
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd="/tmp"
    )
