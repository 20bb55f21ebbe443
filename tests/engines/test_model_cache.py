"""The model cache's directories (``gpu_worker.engines.cpu_weights.cached_model_dir``): written once, whole, readable by all."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_worker.engines.cpu_weights import cached_model_dir


def writer(calls: list[Path], text: str):
    def fill(into: Path) -> None:
        calls.append(into)
        (into / "config.json").write_text(text)
        (into / "sub").mkdir()
        (into / "sub" / "weights.bin").write_bytes(b"w")

    return fill


def test_a_model_directory_is_filled_once_then_read_from_the_cache(tmp_path: Path):
    calls: list[Path] = []
    # WHEN the same directory is asked for twice
    first = cached_model_dir(tmp_path / "m", writer(calls, "one"))
    again = cached_model_dir(tmp_path / "m", writer(calls, "two"))
    # THEN it was filled once, in a temporary directory renamed into place, readable by other users; nothing is left
    assert first == again == tmp_path / "m" and len(calls) == 1 and calls[0] != first
    assert (first / "config.json").read_text() == "one"
    assert oct((first / "sub").stat().st_mode & 0o777) == "0o755"
    assert oct((first / "sub" / "weights.bin").stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_process_that_lost_the_race_uses_the_winners_copy(tmp_path: Path):
    # GIVEN another process that renamed its copy into place while this one was filling its own
    def fill(into: Path) -> None:
        writer([], "mine")(into)
        cached_model_dir(tmp_path / "m", writer([], "winner"))

    # WHEN this one renames THEN it finds the target there and uses it, and its own copy is removed
    assert (cached_model_dir(tmp_path / "m", fill) / "config.json").read_text() == "winner"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_fill_that_fails_leaves_no_directory(tmp_path: Path):
    def fill(into: Path) -> None:
        (into / "partial").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        cached_model_dir(tmp_path / "m", fill)
    assert list(tmp_path.iterdir()) == []
