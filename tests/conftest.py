"""Fixtures shared by the suites that run the local stack (tests/e2e, tests/faults, tests/worker).

The stack is deployed from a cloud assembly synthesized once per session, with cdk.json's context plus the tenants
the suites use, exactly as `make synth` would build it with `-c tenants=...`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_worker.engines.torch_env import before_torch
from local_runtime.synth import synthesize

# Before any test module imports torch, as the CPU engines set it before they load it: torch reads it once.
before_torch()

TEST_TENANTS = ("demo", "tenant-a", "tenant-b", "faults")


@pytest.fixture(scope="session")
def local_assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cloud assembly of the app whose tenants are TEST_TENANTS."""
    return synthesize(tmp_path_factory.mktemp("cdk.out"), {"tenants": {tenant: {} for tenant in TEST_TENANTS}})


# What makes a test synthesize the CDK app: one of these fixtures anywhere in its fixture closure, or a module that
# synthesizes by itself. Such a test is marked `cdk` here, from what it uses, so that `make test-fast` (which
# deselects `cdk`) cannot be defeated by a file that forgot its marker: 61 such tests once carried none.
SYNTHESIZING_FIXTURES = frozenset(
    {"local_assembly", "synthesized", "synth_variant", "stack_template", "worker_context"}
)
SYNTHESIZING_CALLS = ("synthesize(", "Template.from_stack(", "App(", "tests.cdk.conftest")


def _synthesizes(path: Path, cache: dict[Path, bool]) -> bool:
    if path not in cache:
        text = path.read_text(encoding="utf-8") if path.suffix == ".py" else ""
        cache[path] = any(call in text for call in SYNTHESIZING_CALLS)
    return cache[path]


# `make test` runs on three processes (pytest-xdist, `-n 3`; Makefile's TEST_PROCESSES).
# What goes to one process whole, in its order: each shard of the end-to-end folder (its tests share one session stack
# per process; the files alternate between the shards in name order), each folder of STACK_FOLDERS, and each other test
# file (a module's fixtures, a model loaded or a corpus run, are then made once). xdist's own `loadgroup` cannot say
# this: it marks a group in the test's node id, which pytest 9 no longer lets a plugin change.
E2E_FOLDER = "tests/e2e/"
E2E_SHARDS = 2
# Folders whose tests share a session stack of their own (a local stack's start costs about 18 s of CPU): each goes to
# one process whole, so that its stack starts once, not once on every process that runs one of its files.
STACK_FOLDERS = ("tests/faults/", "tests/batchworker/", "tests/worker/", "tests/client/")
# Files that load the real model go out right after the end-to-end shards: each costs a load and tens of seconds to
# minutes of decoding whatever its number of tests, so handed out by test count, as xdist does, the heaviest could start
# last and run alone while the other processes idle. The conformance corpus run, the longest of them (4.6 minutes of a
# clean clone's 13 on three processes, where it started last), goes out with the shards.
LOADS_THE_MODEL = "pytest.mark.model"
LONGEST_FILES = ("tests/conformance/test_engine_execution.py",)


def _scope_rank(scope: str) -> int:
    """0: an end-to-end shard or one of LONGEST_FILES; 1: a folder of one stack, or a file that loads the real model;
    2: any other file."""
    if (scope.startswith(E2E_FOLDER) and not scope.endswith(".py")) or scope in LONGEST_FILES:
        return 0
    if scope in STACK_FOLDERS:
        return 1
    path = Path(scope)
    return 1 if path.suffix == ".py" and LOADS_THE_MODEL in path.read_text(encoding="utf-8") else 2


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ShardOrFile(LoadScopeScheduling):
        """xdist's scope scheduling with the scopes above: the end-to-end shards and the longest files first, then the
        stack folders and the files that load the model, then the others, each rank largest first."""

        _ranked = False
        _shards: dict[str, int] | None = None

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            folder = next((folder for folder in STACK_FOLDERS if path.startswith(folder)), None)
            if folder is not None:
                return folder
            if not path.startswith(E2E_FOLDER):
                return path
            if self._shards is None:
                files = sorted({n.split("::", 1)[0] for n in self.collection if n.startswith(E2E_FOLDER)})
                self._shards = {file: i % E2E_SHARDS for i, file in enumerate(files)}
            return f"{E2E_FOLDER}shard-{self._shards[path]}"

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ranked:  # the first assignment: the queue is complete, in xdist's order (most tests first)
                self._ranked = True
                ranked = sorted(self.workqueue.items(), key=lambda item: _scope_rank(item[0]))
                self.workqueue.clear()
                self.workqueue.update(ranked)
            super()._assign_work_unit(node)

    return ShardOrFile(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules: dict[Path, bool] = {}
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SYNTHESIZING_FIXTURES or _synthesizes(Path(item.path), modules):
            item.add_marker(pytest.mark.cdk)
