"""What the deploy stage's checks share: commands echoed into the log, and failures that
say what was expected and what was seen."""

import json
import shlex
import subprocess
import sys
import time


class Failed(Exception):
    """A check of the deploy stage failed; the message says which and why."""


def log(message):
    print(message, flush=True)


def run(cmd, check=True, timeout=600, quiet=False, **kwargs):
    """Runs cmd, echoing it and its output into the log (neither when quiet: a probe
    repeated until something holds); returns its stdout (stripped)."""
    if not quiet:
        log("$ " + " ".join(shlex.quote(str(c)) for c in cmd))
    started = time.monotonic()
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, **kwargs)
    output = (done.stdout + done.stderr).rstrip()
    if output and not quiet:
        log(output)
    if check and done.returncode != 0:
        raise Failed(f"`{' '.join(map(str, cmd))}` exited {done.returncode} after "
                     f"{time.monotonic() - started:.1f} s")
    return done.stdout.strip()


def expect(condition, what, seen):
    """Logs a passed check, or raises Failed naming what was expected and what was seen."""
    if not condition:
        raise Failed(f"expected {what}; saw {seen}")
    log(f"ok: {what}")


def json_line(text, source):
    """The last line of text that is a JSON object (a peer's report)."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise Failed(f"{source} printed no JSON report: {text!r}")


def wait_for(what, probe, timeout, interval=0.5):
    """Calls probe until it returns something true; returns (value, seconds waited)."""
    started = time.monotonic()
    while True:
        value = probe()
        if value:
            return value, time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise Failed(f"{what} within {timeout} s")
        time.sleep(interval)


def main_guard(body):
    """Runs body(); a Failed ends the program with exit status 1 and its message."""
    try:
        body()
    except Failed as failure:
        log(f"FAILED: {failure}")
        sys.exit(1)
