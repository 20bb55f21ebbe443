"""The worker image's build context as BuildKit sends it (issue 27, blocker 1): the ignore file beside the Dockerfile
admitted only async_inference/ and gpu_worker/ while the Dockerfile copies async_inference_client/ too, so the image
could not build. ``cdk.worker_image`` assembles the context as BuildKit does, without Docker; the rules it follows
are Docker's documented ones (docs.docker.com/build/concepts/context/#dockerignore-files), each checked below."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdk.worker_image import (
    REPO_ROOT,
    WORKER_DOCKERFILE,
    assemble,
    context_files,
    copy_sources,
    missing_copy_sources,
    read_patterns,
)

DOCKERFILE_TEXT = (REPO_ROOT / WORKER_DOCKERFILE).read_text()


def _tree(root: Path, *files: str) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    return root


def _context(tmp_path: Path, ignore: str, *files: str, dockerfile: str = "Dockerfile") -> list[str]:
    _tree(tmp_path, dockerfile, *files)
    (tmp_path / ".dockerignore").write_text(ignore)
    return context_files(tmp_path, dockerfile)


# --- the worker image -----------------------------------------------------------------------------------------------


def test_every_copy_source_of_the_worker_dockerfile_is_in_its_build_context():
    # GIVEN the repository as the build context of gpu_worker/Dockerfile, filtered as BuildKit filters it
    files = context_files()
    # WHEN each COPY source is looked up in it
    sources = copy_sources(DOCKERFILE_TEXT)
    # THEN none is missing (a missing one fails `docker build`, and with it `cdk deploy`'s asset publishing)
    assert {"async_inference", "async_inference_client", "gpu_worker"} <= set(sources)
    assert missing_copy_sources(files, sources) == []


def test_the_build_context_holds_nothing_the_dockerfile_does_not_copy():
    # GIVEN the worker's build context WHEN each file is matched against the COPY sources
    sources = copy_sources(DOCKERFILE_TEXT)
    extra = [f for f in context_files() if not any(f == s or f.startswith(s + "/") for s in sources)]
    # THEN each is copied: the ignore file admits no more than the image holds (nor the GBs of venvs and caches)
    assert extra == []


def test_the_assembled_context_is_a_copy_of_exactly_those_files(tmp_path: Path):
    # GIVEN the context assembled into a directory WHEN listing what it holds
    copied = assemble(tmp_path / "context")
    held = sorted(str(p.relative_to(tmp_path / "context")) for p in (tmp_path / "context").rglob("*") if p.is_file())
    # THEN it is the context's files, byte for byte, and no compiled leftovers
    assert held == sorted(copied) == context_files()
    assert (tmp_path / "context" / "gpu_worker" / "worker.py").read_bytes() == (
        REPO_ROOT / "gpu_worker" / "worker.py"
    ).read_bytes()
    assert not [f for f in held if "__pycache__" in f or f.endswith(".pyc")]


# --- BuildKit's rules -----------------------------------------------------------------------------------------------


def test_the_ignore_file_beside_the_dockerfile_takes_precedence_over_dockerignore(tmp_path: Path):
    # GIVEN a .dockerignore that excludes a.txt, and docker/app.Dockerfile.dockerignore that excludes b.txt
    _tree(tmp_path, "docker/app.Dockerfile", "a.txt", "b.txt")
    (tmp_path / ".dockerignore").write_text("a.txt\n")
    (tmp_path / "docker/app.Dockerfile.dockerignore").write_text("b.txt\n")
    # WHEN the context of docker/app.Dockerfile is assembled THEN only the file beside it applies
    files = context_files(tmp_path, "docker/app.Dockerfile")
    assert "a.txt" in files and "b.txt" not in files
    # AND another Dockerfile of the same context gets .dockerignore
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    assert "a.txt" not in context_files(tmp_path, "Dockerfile")


def test_the_last_matching_line_decides():
    # The two examples of Docker's documentation ("Negating matches").
    files = ["README-secret.md", "README.md", "notes.md"]

    def kept(ignore: str) -> list[str]:
        from cdk.worker_image import PatternMatcher

        matcher = PatternMatcher(read_patterns(ignore))
        return [f for f in files if not matcher.matches(f)[0]]

    assert kept("*.md\n!README*.md\nREADME-secret.md\n") == ["README.md"]
    assert kept("*.md\nREADME-secret.md\n!README*.md\n") == ["README-secret.md", "README.md"]


def test_a_star_stays_in_one_directory_and_two_stars_span_any_number(tmp_path: Path):
    # GIVEN *.md (the root only) and **/*.log (anywhere, the root included)
    files = _context(tmp_path, "*.md\n**/*.log\n", "a.md", "sub/b.md", "c.log", "sub/deep/d.log", "keep.txt")
    # THEN
    assert files == [".dockerignore", "Dockerfile", "keep.txt", "sub/b.md"]


def test_an_excluded_directory_excludes_its_files_unless_an_exception_readmits_them(tmp_path: Path):
    # GIVEN everything excluded but one package, whose caches are excluded again
    files = _context(
        tmp_path, "*\n!pkg/\n**/__pycache__\n", "pkg/a.py", "pkg/__pycache__/a.pyc", "pkg/sub/b.py", "other/c.py"
    )
    # THEN the package's sources alone are sent (and not the Dockerfile: BuildKit sends it apart from the context)
    assert files == ["pkg/a.py", "pkg/sub/b.py"]


@pytest.mark.parametrize(
    ("line", "pattern"),
    [("/foo/bar/", "foo/bar"), ("  foo/./bar  ", "foo/bar"), ("! /pkg/", "!pkg"), ("a/../b", "b")],
)
def test_patterns_are_cleaned_as_the_ignore_file_reader_cleans_them(line: str, pattern: str):
    assert read_patterns(f"# a comment\n\n{line}\n") == [pattern]


def test_a_copy_source_that_names_nothing_in_the_context_is_reported():
    files = ["pkg/a.py", "setup.cfg"]
    dockerfile = "FROM x\nCOPY pkg/ /app/pkg/\nCOPY --chown=1:1 setup.cfg missing/ /app/\nCOPY --from=build /out /out\n"
    assert copy_sources(dockerfile) == ["pkg", "setup.cfg", "missing"]
    assert missing_copy_sources(files, copy_sources(dockerfile)) == ["missing"]
