"""``make bench-attacks-stack``: bench/attacks.py's engine attacks through the local stack (the template deployed to
moto, the API, one CPU-engine worker of 8 rows), as issue 30 measured them: tenant B's 8-token job time, from its
``POST /v1/jobs`` to ``GET /v1/jobs/{id}`` reading it final, under attack over its time alone (median of three, taken
just before each attack). Each attack is tenant A's, submitted through the API just before B's job; what the API
refuses (a 400) never reaches the worker. The webhook attack: B's job with a webhook, from its ``POST`` to its
delivery at B's receiver, under attack over alone; the attack is 20 of A's jobs whose webhooks go to 20 receivers
dripping one header line a second (bench/attacks.py), finished just before B submits, so that their deliveries are
under way or queued when B's event is published.

Prints one line per attack and ends with one JSON object: ``{attack: ratio}``; exits 1 when one is over the goal of
2x, as ``make bench-attacks`` does. ``--only rows,webhook`` runs only the attacks named.
"""

from __future__ import annotations

import concurrent.futures
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import requests

from async_inference.webhooks.receiver import Receiver
from bench.attacks import LOOPING_TEMPLATE, dripping_receiver, patterned, schema_format
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment

KEYS = {"tenant-a-key-0123456789": "tenant-a", "tenant-b-key-0123456789": "tenant-b"}
A, B = KEYS
FINAL = {"succeeded", "failed", "cancelled", "expired"}


class Client:
    def __init__(self, stack: LocalDeployment, model: str) -> None:
        self.url = stack.api_url
        self.model = model

    def chat(self, text: str, **body: Any) -> dict[str, Any]:
        return {"model": self.model, "messages": [{"role": "user", "content": text}], "temperature": 0, **body}

    def submit(self, key: str, body: dict[str, Any]) -> str | None:
        """The job id, or None when the API refused the request (it never reaches a worker)."""
        response = requests.post(f"{self.url}/v1/jobs", json=body, headers={"x-api-key": key}, timeout=60)
        return response.json()["job_id"] if response.status_code == 202 else None

    def upload(self, key: str, request: dict[str, Any]) -> str | None:
        data = json.dumps(request).encode()
        created = requests.post(
            f"{self.url}/v1/jobs", json={"upload": {"size_bytes": len(data)}}, headers={"x-api-key": key}, timeout=60
        ).json()
        upload = created["upload"]
        requests.put(upload["url"], data=data, headers=upload["headers"], timeout=120)
        return created["job_id"]

    def status(self, key: str, job_id: str) -> str:
        response = requests.get(f"{self.url}/v1/jobs/{job_id}", headers={"x-api-key": key}, timeout=60)
        return response.json()["status"]

    def wait(self, key: str, job_id: str, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while self.status(key, job_id) not in FINAL:
            if time.monotonic() > deadline:
                raise TimeoutError(job_id)
            time.sleep(0.05)

    def victim(self) -> float:
        started = time.monotonic()
        job_id = self.submit(B, {"request": self.chat("What is the capital of France?", max_tokens=8)})
        assert job_id is not None
        self.wait(B, job_id)
        return time.monotonic() - started

    def webhook_victim(self, receiver: Receiver) -> float:
        """Seconds from B's job's submission to its webhook's delivery at ``receiver``."""
        started = time.monotonic()
        seen = len(receiver.wait_for(0, timeout_s=0))
        webhook = {"url": receiver.url, "events": ["completed"]}
        job_id = self.submit(
            B, {"request": self.chat("What is the capital of France?", max_tokens=8), "webhook": webhook}
        )
        assert job_id is not None
        receiver.wait_for(seen + 1, timeout_s=120)
        return time.monotonic() - started

    def cancel_all(self, job_ids: list[str]) -> None:
        """A's jobs left: cancelled, and waited for, so that the next measurement alone is alone."""
        for job_id in job_ids:
            requests.post(f"{self.url}/v1/jobs/{job_id}/cancel", headers={"x-api-key": A}, timeout=60)
        for job_id in job_ids:
            self.wait(A, job_id)


def attacks(client: Client) -> dict[str, Callable[[], list[str | None]]]:
    def grammar() -> list[str | None]:
        big = [
            client.submit(
                A, {"request": client.chat("x", max_tokens=8, response_format=schema_format(patterned(1600)))}
            )
        ]
        salt = str(time.monotonic())
        return big + [
            client.submit(
                A,
                {"request": client.chat("x", max_tokens=8, response_format=schema_format(patterned(64, f"{salt}{i}")))},
            )
            for i in range(4)
        ]

    def rows() -> list[str | None]:
        bodies = [{"request": client.chat(f"Count to {i}.", max_tokens=32, n=8, temperature=1)} for i in range(40)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda body: client.submit(A, body), bodies))

    return {
        "grammar": grammar,
        "template": lambda: [
            client.submit(
                A, {"request": client.chat("x", max_tokens=8, chat_template_kwargs={"chat_template": LOOPING_TEMPLATE})}
            )
        ],
        "tokenize": lambda: [
            client.submit(A, {"request": client.chat("x", max_tokens=8, chat_template_kwargs={"tokenize": True})})
        ],
        "huge_prompt": lambda: [client.upload(A, client.chat("word " * 3_000_000, max_tokens=8))],
        "rows": rows,
    }


def webhook_attack(client: Client) -> tuple[float, float]:
    """(B's webhook time alone, median of three; under attack): the attack is 20 of A's jobs whose webhooks go to 20
    receivers dripping one header line a second, finished just before B submits."""
    stop = threading.Event()
    try:
        with Receiver() as receiver:
            alone = statistics.median(client.webhook_victim(receiver) for _ in range(3))
            drips = [dripping_receiver(stop) for _ in range(20)]
            attack = [
                client.submit(
                    A,
                    {
                        "request": client.chat(f"Say {i}.", max_tokens=1),
                        "webhook": {"url": f"http://127.0.0.1:{port}/in", "events": ["completed"]},
                    },
                )
                for i, port in enumerate(drips)
            ]
            for job_id in attack:
                assert job_id is not None
                client.wait(A, job_id)
            took = client.webhook_victim(receiver)
            return alone, took
    finally:
        stop.set()


def main() -> int:
    stack = LocalDeployment.with_tenants(
        KEYS,
        api_port=free_port(),
        moto_port=free_port(),
        workers=0,
        engine="cpu",
        worker_env={"RECEIVE_WAIT_S": "1", "MAX_NUM_SEQS": "8"},
    ).start()
    stack.export_env()
    assert stack.served_models
    try:
        stack.start_worker()
        client = Client(stack, stack.served_models[0])
        client.victim()  # the worker's start and the first prefill
        ratios: dict[str, float] = {}
        only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
        if only is None or "webhook" in only:
            alone, took = webhook_attack(client)
            ratios["webhook"] = round(took / alone, 2)
            print(f"webhook: {took:.2f} s under attack, {alone:.2f} s alone: {ratios['webhook']}x", flush=True)
        for name, attack in attacks(client).items():
            if only is not None and name not in only:
                continue
            alone = statistics.median(client.victim() for _ in range(3))
            started = [job for job in attack() if job is not None]
            took = client.victim()
            client.cancel_all(started)
            ratios[name] = round(took / alone, 2)
            print(
                f"{name}: {took:.2f} s under attack, {alone:.2f} s alone: {ratios[name]}x "
                f"({len(started)} of A's jobs accepted)",
                flush=True,
            )
        print(json.dumps(ratios))
    finally:
        stack.stop()
    return 0 if all(ratio <= 2 for ratio in ratios.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
