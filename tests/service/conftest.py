"""The service tests run the built binaries: ctest sets TENSORD_BIN and TENSORCTL_BIN."""

import os

import pytest


def pytest_configure(config):
    if not os.environ.get("TENSORD_BIN") or not os.environ.get("TENSORCTL_BIN"):
        pytest.exit("set TENSORD_BIN and TENSORCTL_BIN to the built tensord and tensorctl", returncode=2)
