"""moto in server mode, as a subprocess: a real HTTP endpoint that boto3 talks to."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# The credentials moto accepts. A deployed function or task gets its role's credentials from its runtime; locally
# these stand in for them (and carry no region: the region is the runtime's, or the task definition's, to give).
LOCAL_KEYS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}
# What a client process (the CLI, a test, a benchmark) needs besides the endpoint.
LOCAL_CREDENTIALS = {**LOCAL_KEYS, "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


MOTO_STOP_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """Starts ``moto_server`` on 127.0.0.1:port and waits until it answers; ``stop`` ends it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> MotoServer:
        env = dict(os.environ, **LOCAL_CREDENTIALS)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "local_runtime.moto_main", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            cwd=Path(__file__).resolve().parent.parent,  # the repository root, where local_runtime imports from
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0,  # a terminal's Ctrl-C reaches only the local runtime, which stops moto last
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"moto server exited with code {self._process.returncode} (is port {self.port} free?)"
                )
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/data.json", timeout=1).read()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto server did not answer on {self.url} within {timeout_s} s")

    def kill(self) -> None:
        if self._process and self._process.poll() is None:
            self._process.kill()

    def stop(self) -> None:
        if self._process and self._process.poll() is None:
            self._process.terminate()
            try:
                # moto joins its request threads on exit, and a long poll (ReceiveMessage) holds one for up to 20 s
                # after its client left; its state is in memory and goes anyway.
                self._process.wait(timeout=MOTO_STOP_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
