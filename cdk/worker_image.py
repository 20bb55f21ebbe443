"""What the worker image holds: its build context as BuildKit sends it, read from the one list of it, the ignore file
beside the Dockerfile (``gpu_worker/Dockerfile.dockerignore``).

BuildKit takes ``<Dockerfile>.dockerignore`` beside the Dockerfile before ``.dockerignore`` at the context's root, reads
it as ``moby/patternmatcher/ignorefile.ReadAll`` does and filters the context as ``tonistiigi/fsutil``'s walk does:
Go's ``filepath.Match`` per path segment plus ``**`` (any number of segments), ``!`` exceptions, the last pattern that
matches a path deciding, and a directory's match applying to everything under it. This module does the same without
Docker, so that a test and ``make image-check`` see the context a ``docker build`` would see, and the CDK asset
stages the same patterns (``cdk.gpu_worker_service.WORKER_IMAGE_EXCLUDE``). The Dockerfile's ``COPY`` sources are
checked against the context (``missing_copy_sources``).
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER_DOCKERFILE = "gpu_worker/Dockerfile"  # relative to the build context, the repository root
ROOT_IGNORE_FILE = ".dockerignore"


def ignore_file(context: Path, dockerfile: str) -> Path | None:
    """The ignore file BuildKit reads for ``dockerfile``: the one beside it named after it, else the context's
    ``.dockerignore``, else none."""
    beside = context / f"{dockerfile}.dockerignore"
    if beside.is_file():
        return beside
    root = context / ROOT_IGNORE_FILE
    return root if root.is_file() else None


def read_patterns(text: str) -> list[str]:
    """The patterns of an ignore file, as ``ignorefile.ReadAll`` gives them: comment lines (``#`` in column 1) and
    blank lines dropped, whitespace trimmed, each path cleaned and made relative (``/a/b/`` is ``a/b``), ``!`` kept."""
    patterns = []
    for number, line in enumerate(text.splitlines()):
        if number == 0:
            line = line.removeprefix("\ufeff")
        if line.startswith("#"):
            continue
        pattern = line.strip()
        if not pattern:
            continue
        invert = pattern.startswith("!")
        if invert:
            pattern = pattern[1:].strip()
        if pattern:
            pattern = posixpath.normpath(pattern)
            if pattern.startswith("//"):  # normpath keeps two leading slashes; Go's Clean does not
                pattern = "/" + pattern.lstrip("/")
            if len(pattern) > 1 and pattern.startswith("/"):
                pattern = pattern[1:]
        patterns.append("!" + pattern if invert else pattern)
    return patterns


def context_patterns(context: Path = REPO_ROOT, dockerfile: str = WORKER_DOCKERFILE) -> list[str]:
    """The exclude patterns BuildKit applies to ``context`` when it builds ``dockerfile`` (none without a file)."""
    path = ignore_file(context, dockerfile)
    return read_patterns(path.read_text()) if path is not None else []


@dataclass(frozen=True)
class Pattern:
    """One pattern of ``patternmatcher.New``: cleaned, its ``!`` stripped into ``exclusion``."""

    text: str
    exclusion: bool
    regex: re.Pattern[str]

    @classmethod
    def parse(cls, raw: str) -> Pattern:
        text = raw.strip()
        exclusion = text.startswith("!")
        if exclusion:
            text = text[1:]
            if not text:
                raise ValueError('illegal exclusion pattern: "!"')
        text = posixpath.normpath(text)
        return cls(text=text, exclusion=exclusion, regex=re.compile(_regex(text)))

    def matches(self, path: str) -> bool:
        return self.regex.match(path) is not None

    @property
    def without_trailing_glob(self) -> str:
        """The pattern less a trailing ``/**`` or ``/*`` (fsutil's ``patternWithoutTrailingGlob``)."""
        return self.text.removesuffix("/**").removesuffix("/*")


def _regex(pattern: str) -> str:
    """``Pattern.compile`` of patternmatcher: ``*`` and ``?`` stay within a segment, ``**`` spans segments, ``**``
    at the start also matches nothing (``**/foo`` matches ``foo``), ``\\`` escapes the next character."""
    out, i, in_class = "^", 0, False
    while i < len(pattern):
        ch = pattern[i]
        if in_class:  # a character class passes to the regex as written, as in Go's (and filepath.Match's)
            out += ch
            in_class = ch != "]"
        elif ch == "*":
            if pattern[i + 1 : i + 2] == "*":
                i += 1
                if pattern[i + 1 : i + 2] == "/":
                    i += 1
                out += ".*" if i + 1 == len(pattern) else "(.*/)?"
            else:
                out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\":
            if i + 1 < len(pattern):
                i += 1
                out += re.escape(pattern[i])
            else:
                out += "\\\\"
        elif ch == "[":
            out, in_class = out + ch, True
        else:
            out += re.escape(ch)
        i += 1
    return out + "$"


class PatternMatcher:
    """``patternmatcher.PatternMatcher``: does a path match the exclude patterns, the last matching one deciding."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = [Pattern.parse(p) for p in patterns if p.strip()]

    def matches(self, path: str, parent_matched: list[bool] | None = None) -> tuple[bool, list[bool]]:
        """``MatchesUsingParentResults``: (excluded, which patterns matched), given which matched the parent
        directory (a pattern that matched a directory matches everything under it)."""
        matched, info = False, []
        for index, pattern in enumerate(self.patterns):
            match = bool(parent_matched and parent_matched[index])
            if not match and pattern.exclusion == matched:
                match = pattern.matches(path)
                if not match and parent_matched is None:  # no parent results: try each parent, as the walk's root
                    parts = path.split("/")[:-1]
                    match = any(pattern.matches("/".join(parts[: n + 1])) for n in range(len(parts)))
            info.append(match)
            if match:
                matched = not pattern.exclusion
        return matched, info

    def can_skip(self, directory: str) -> bool:
        """Whether an excluded directory can be left unwalked: no exception could admit anything inside it. Only
        decided when every exception is a plain prefix (fsutil's ``onlyPrefixExcludeExceptions``)."""
        exceptions = [p for p in self.patterns if p.exclusion]
        if any(re.search(r"[*\[\]?^\\]", p.without_trailing_glob) for p in exceptions):
            return False
        return not any((p.without_trailing_glob + "/").startswith(directory + "/") for p in exceptions)


def context_files(context: Path = REPO_ROOT, dockerfile: str = WORKER_DOCKERFILE) -> list[str]:
    """Every file (and symbolic link) BuildKit sends as the build context of ``dockerfile``, as paths relative to
    ``context``, sorted. Symbolic links are not followed (a link to a directory is sent as the link)."""
    matcher = PatternMatcher(context_patterns(context, dockerfile))
    files: list[str] = []

    def walk(directory: Path, relative: str, parent_info: list[bool] | None) -> None:
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            path = f"{relative}/{entry.name}" if relative else entry.name
            excluded, info = matcher.matches(path, parent_info)
            if entry.is_dir(follow_symlinks=False):
                if excluded and matcher.can_skip(path):
                    continue
                walk(Path(entry.path), path, info)
            elif not excluded:
                files.append(path)

    walk(context, "", None)
    return files


def assemble(into: Path, context: Path = REPO_ROOT, dockerfile: str = WORKER_DOCKERFILE) -> list[str]:
    """Copy the build context BuildKit would send into ``into`` (which must not exist); the files copied."""
    into.mkdir(parents=True)
    files = context_files(context, dockerfile)
    for relative in files:
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(context / relative, target, follow_symlinks=False)
    return files


def copy_sources(dockerfile_text: str) -> list[str]:
    """The context paths the Dockerfile's ``COPY`` and ``ADD`` instructions take (those ``--from`` a stage or image
    excepted), cleaned as BuildKit resolves them against the context."""
    joined = re.sub(r"\\\n", " ", dockerfile_text)
    sources = []
    for line in joined.splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        arguments = words[1:]
        if any(a.startswith("--from") for a in arguments):
            continue
        paths = [a for a in arguments if not a.startswith("--")]
        sources += [posixpath.normpath(p).lstrip("/") or "." for p in paths[:-1]]
    return sources


def missing_copy_sources(files: list[str], sources: list[str]) -> list[str]:
    """The sources that name nothing in the context (``files``, as ``context_files`` gives them): what makes
    ``docker build`` fail with '"/x": not found'. A source names a file or a directory with a file under it."""
    present = set(files)
    return [s for s in sources if s != "." and s not in present and not any(f.startswith(s + "/") for f in files)]
