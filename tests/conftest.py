"""Fixtures shared by the suites that run the local stack (tests/e2e, tests/faults, tests/worker).

The stack is deployed from a cloud assembly synthesized once per session, with cdk.json's context plus the tenants
the suites use, exactly as `make synth` would build it with `-c tenants=...`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from local_runtime.synth import synthesize

TEST_TENANTS = ("demo", "tenant-a", "tenant-b", "faults")


@pytest.fixture(scope="session")
def local_assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cloud assembly of the app whose tenants are TEST_TENANTS."""
    return synthesize(tmp_path_factory.mktemp("cdk.out"), {"tenants": {tenant: {} for tenant in TEST_TENANTS}})
