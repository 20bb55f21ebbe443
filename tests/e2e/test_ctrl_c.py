"""Ctrl-C on `make up`: a terminal sends SIGINT to the whole foreground process group, and the stack stops cleanly.

These start `python -m local_runtime up` as `make up` does, in a process group of its own (a terminal's foreground
job), and send SIGINT to that group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from local_runtime.moto_server import free_port

pytestmark = pytest.mark.e2e
REPO_ROOT = Path(__file__).resolve().parents[2]
STOPS_WITHIN_S = 15.0  # about 3 s on an idle machine; the rest is room for a loaded one
KEY = "ctrl-c-test-key-0123456789"


def tracebacks(*texts: str) -> int:
    return sum(text.count("Traceback (most recent call last)") for text in texts)


@pytest.fixture(scope="module")
def make_up(
    tmp_path_factory: pytest.TempPathFactory, local_assembly: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """`python -m local_runtime up` with the echo engine and two workers, serving; yields it, its output file and its
    log folder (given as one that does not exist yet). Whatever it started is killed afterwards if still there. One
    for the module (a start is half a minute): the log folder it made stays there after the Ctrl-C test stops it."""
    tmp_path = tmp_path_factory.mktemp("up")
    log_dir = tmp_path / "not" / "yet" / "logs"
    outputs, output = tmp_path / "outputs.json", tmp_path / "up.out"
    env = {
        **os.environ,
        "LOCAL_ASSEMBLY": str(local_assembly),
        "ENGINE": "echo",
        "WORKERS": "2",
        "API_PORT": str(free_port()),
        "MOTO_PORT": str(free_port()),
        "WS_PORT": str(free_port()),
        "LOCAL_LOG_DIR": str(log_dir),
        "LOCAL_API_KEYS": f"{KEY}=demo",
        "PYTHONPATH": str(REPO_ROOT),
    }
    with open(output, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "local_runtime", "up", "--outputs-file", str(outputs)],
            env=env,
            cwd=REPO_ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            process_group=0,
        )  # its own group, as a shell gives a foreground job
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 180
        while not outputs.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert outputs.exists(), f"`up` did not come up: {output.read_text(errors='replace')[-3000:]}"
        api_url = json.loads(outputs.read_text())["api_url"]
        request = urllib.request.Request(f"{api_url}/v1/openapi.json", headers={"x-api-key": KEY})
        urllib.request.urlopen(request, timeout=10).read()
        time.sleep(3)  # the workers poll their queue, as they would when someone presses Ctrl-C
        started = psutil.Process(process.pid).children(recursive=True)
        yield process, output, log_dir
    finally:
        for child in [psutil.Process(process.pid)] + started if process.poll() is None else started:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        process.wait(timeout=30)


def test_ctrl_c_stops_the_whole_stack_within_seconds_without_tracebacks(make_up) -> None:
    # GIVEN `up` serving, with its moto server, functions and workers in its process group's reach
    process, output, log_dir = make_up
    children = psutil.Process(process.pid).children(recursive=True)
    assert len(children) >= 4, "moto, the functions and two workers run as child processes"

    # WHEN the terminal sends SIGINT to the whole foreground group
    sent = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)

    # THEN `up` exits 0 within seconds, leaving no process of its own behind and no traceback in its output or logs
    try:
        code = process.wait(timeout=STOPS_WITHIN_S)
    except subprocess.TimeoutExpired:
        code = None
    took = time.monotonic() - sent
    text = output.read_text(errors="replace")
    logs = "".join(p.read_text(errors="replace") for p in log_dir.rglob("*.log"))
    assert code == 0, f"still running or failed ({code}) {took:.1f} s after Ctrl-C:\n{text[-3000:]}"
    _, alive = psutil.wait_procs(children, timeout=2)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
    assert tracebacks(text, logs) == 0, text[-3000:] + logs[-3000:]
    assert "stopping" in text


def test_up_creates_its_log_folder(make_up) -> None:
    # GIVEN `up` started with a LOCAL_LOG_DIR that did not exist (the fixture names one under folders not yet made)
    process, output, log_dir = make_up

    # THEN it made the folder and writes its function log there
    assert (log_dir / "functions.log").is_file(), output.read_text(errors="replace")[-2000:]
