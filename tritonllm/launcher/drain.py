"""`tritonllm drain`: a pod's preStop hook, which waits for the llm engines to go idle."""

from __future__ import annotations

import argparse
import time

from tritonllm.launcher.progress import progress as _progress


def drain(args: argparse.Namespace) -> int:
    """Waits until the llm engines run and queue nothing (a pod's preStop hook for the tritonserver container,
    so that it stops only once the shim's streams have ended); at most `--timeout` seconds."""
    import re
    import urllib.request

    from tritonllm.launcher.tritonserver import TRANSPORT_ERRORS

    busy = re.compile(r"^tritonllm_requests_(?:running|waiting)\{[^}]*\}\s+([0-9.e+-]+)$", re.MULTILINE)
    deadline = time.monotonic() + args.timeout
    quiet_since = None
    while time.monotonic() < deadline:
        try:
            text = urllib.request.urlopen(args.metrics_url, timeout=2).read().decode()
        except TRANSPORT_ERRORS:
            return 0  # the server is gone (a self-connect to its closed port included): nothing left to drain
        if sum(float(v) for v in busy.findall(text)) == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= args.quiet_seconds:
                return 0
        else:
            quiet_since = None
        time.sleep(0.5)
    _progress(f"requests still running after {args.timeout}s; stopping anyway")
    return 1
