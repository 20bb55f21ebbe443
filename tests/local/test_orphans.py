"""The local runtime's own processes (moto server, the functions' execution environments) run in process groups of
their own, so that a terminal's Ctrl-C reaches only the runtime, which stops them in order. When the runtime is killed
outright instead (SIGKILL), they must not outlive it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from local_runtime.moto_server import free_port

STARTER = """
import sys, time
from local_runtime.moto_server import MotoServer
server = MotoServer(int(sys.argv[1])).start()
print(server._process.pid, flush=True)
time.sleep(600)
"""


def test_moto_server_exits_when_the_runtime_that_started_it_is_killed():
    # GIVEN a process that started a moto server (in a process group of its own) and holds it
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(free_port())], stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    moto = psutil.Process(int(starter.stdout.readline()))
    try:
        # WHEN that process is killed outright, with no chance to stop its server
        starter.send_signal(signal.SIGKILL)
        starter.wait()

        # THEN the server exits within seconds rather than running on as an orphan
        deadline = time.monotonic() + 10
        while moto.is_running() and moto.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not moto.is_running() or moto.status() == psutil.STATUS_ZOMBIE
    finally:
        if moto.is_running():
            moto.kill()
