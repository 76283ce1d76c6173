"""The batch pipeline example runs, reports a rate and leaves nothing behind."""

import os
import subprocess
import sys

from conftest import EXAMPLES


def test_batch_pipeline(broker, client):
    script = os.path.join(EXAMPLES, "batch_pipeline.py")
    result = subprocess.run(
        [sys.executable, script, "--workers", "3", "--batches", "40", "--batch-size", "64",
         "--prefix", "py/pipeline"],
        env=broker.env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "batch 40/40" in result.stderr
    # stderr is a pipe here, not a terminal: one plain line per progress report.
    assert "\r" not in result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("batch ")]
    assert [line.split()[1] for line in progress] == ["10/40", "20/40", "30/40", "40/40"]
    assert "batches/s" in result.stdout and "left behind: 0 tensors" in result.stdout
    assert "in order per worker: yes" in result.stdout
    assert client.list("py/pipeline/") == []
    client.flush()
    status = client.status()
    assert status["named_tensors"] == 0
