"""The functions' source asset is staged in a directory named by its content and never rewritten
(cdk.lambda_code._stage_sources): a synth beside another (a test's variant, ``make synth``) copies its asset from a
directory the other one does not delete under it. The CI run of issue 27 failed on that (ENOENT copying run.sh)."""

from __future__ import annotations

from pathlib import Path

from cdk.lambda_code import _stage_sources


def _project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_second_synths_staging_leaves_the_first_synths_directory_whole(tmp_path: Path):
    # GIVEN a synth that staged its sources and is still copying from them
    project = _project(tmp_path / "project", {"lambdas/api/run.sh": "exec app", "lambdas/api/app.py": "x = 1"})
    first = _stage_sources(project, ["lambdas"], tmp_path / "cache")
    # WHEN another synth, of changed code, stages its own
    (project / "lambdas/api/run.sh").unlink()
    (project / "lambdas/api/app.py").write_text("x = 2")
    second = _stage_sources(project, ["lambdas"], tmp_path / "cache")
    # THEN the first synth's directory still holds what it staged, and the second one's what it staged
    assert first != second
    assert (first / "lambdas/api/run.sh").read_text() == "exec app"
    assert (first / "lambdas/api/app.py").read_text() == "x = 1"
    assert sorted(p.name for p in second.rglob("*") if p.is_file()) == ["app.py"]


def test_the_same_sources_are_staged_once_and_reused(tmp_path: Path):
    project = _project(tmp_path / "project", {"lambdas/handler.py": "pass", "lambdas/notes.md": "not staged"})
    staged = _stage_sources(project, ["lambdas"], tmp_path / "cache")
    assert _stage_sources(project, ["lambdas"], tmp_path / "cache") == staged
    assert [p.name for p in staged.rglob("*") if p.is_file()] == ["handler.py"]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [staged.name]  # no half-built directory left
