"""``LOCAL_ASSEMBLY`` may be relative (``LOCAL_ASSEMBLY=cdk.out.tenants make up``, ``make demo``'s cdk.out.demo): the
functions, which run from other directories, are given its absolute path."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment


def test_a_relative_assembly_is_taken_from_the_directory_it_was_named_in(
    local_assembly: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN the assembly named relative to the working directory
    monkeypatch.chdir(local_assembly.parent)
    stack = LocalDeployment(
        assembly=Path(local_assembly.name), api_port=free_port(), moto_port=free_port(), workers=0, log_dir=tmp_path
    )
    # WHEN the working directory changes (a function's process runs from its own) THEN the stack still names it
    monkeypatch.chdir(tmp_path)
    assert stack.assembly_dir.is_absolute() and (stack.assembly_dir / "manifest.json").is_file()
    assert stack.assembly_dir == local_assembly.resolve()
