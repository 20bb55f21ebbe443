"""Fixtures of the worker tests: the end-to-end suite's local stack, so there is one definition of how one starts."""

from tests.e2e.conftest import api, stack  # noqa: F401 (fixtures)
