"""Defect 8 of issue 21: the dependency layer's asset hash depends on what is installed, not on the folder or the
interpreter that built it (a deploy from another machine must not publish a new layer and update every function)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from aws_cdk import FileSystem

from cdk import lambda_code

pytestmark = [pytest.mark.cdk, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _interpreter_in(folder: Path) -> Path:
    """This virtualenv's Python, seen from another folder (as another checkout's .venv would be): pip writes this
    path into the shebang of every console script it installs."""
    venv = Path(sys.prefix)
    (folder / "bin").mkdir(parents=True)
    (folder / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (folder / "lib").symlink_to(venv / "lib")
    python = folder / "bin" / "python"
    python.symlink_to(Path(sys.executable).resolve())
    return python


def test_the_layer_hash_is_the_same_from_two_checkouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # GIVEN two checkouts, each with its own virtualenv and cdk.out (the same requirements)
    hashes = []
    for checkout in ("a", "b"):
        folder = tmp_path / checkout
        monkeypatch.setattr(sys, "executable", os.fspath(_interpreter_in(folder / ".venv")))
        # WHEN each builds the layer
        layer = lambda_code._install_dependencies(ROOT / "lambdas" / "requirements.lock", folder / "cdk.out")
        hashes.append(FileSystem.fingerprint(os.fspath(layer), exclude=[".complete"]))
        # (the building interpreter's path is nowhere in the layer)
        assert not [p for p in layer.rglob("*") if p.is_file() and os.fspath(folder).encode() in p.read_bytes()]
    # THEN the asset hash CDK computes from each is the same
    assert hashes[0] == hashes[1]
