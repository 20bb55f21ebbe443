"""``python -m local_runtime.moto_main``: moto's server without werkzeug's access log, and with DynamoDB's per-item
atomicity.

werkzeug logs every request at INFO; with the output thrown away that was still about a fifth of the server's CPU in
the soak (py-spy), and moto serves the whole local stack from one process. Warnings and errors still go to stderr.

moto's server answers each request on a thread of its own, and its DynamoDB applies a write in steps on the live item:
two UpdateItems of one item at once could lose a number ADD while keeping both set members (a batch counted
``completed`` with 20 of its 120 lines, tests/local/test_moto_atomicity.py). DynamoDB applies each write to an item
atomically, so here the DynamoDB backend's writes take one lock.

moto's SQS rebuilds a queue's whole attribute summary (three passes over every message it holds, in flight or not,
each message asking the clock twice) for each message it receives and for each message sent, only to read one
setting from it. The cost per message grows with the queue's depth, and under load a queue that falls behind (a
function's event queue) made every request slower, so it fell farther behind: the soak's rate fell from 8.5 to 2.6
jobs/s. Here the retention check reads its one setting, and the scans ask the clock once: same answers, a cost per
message that does not grow with the depth (tests/local/test_moto_sqs_cost.py). And moto lists its own package
directory (a stat per service) on every request to route it; the listing is made once.

moto's standard queues return messages in the order they were sent, whatever their message group: on AWS a standard
queue whose messages carry a MessageGroupId is a fair queue, which delivers a quiet tenant's messages ahead of a noisy
tenant's backlog. The job queues count on it (each claim check's group is its tenant; gpu_worker.fairness), and
without it a tenant's job waited here behind another's backlog of forty, where on AWS it comes first. Here a standard
queue returns the visible messages of the groups with the fewest messages in flight first (AWS's own measure of a noisy
tenant, its share of the messages in flight, without its thresholds), in the order they were sent within that.
"""

import collections
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from moto import backends
from moto.core.utils import unix_time, unix_time_millis
from moto.dynamodb.models import DynamoDBBackend
from moto.server import main
from moto.sqs.models import Message, Queue, SQSBackend

# The DynamoDB backend's item writes (a transaction or a batch counts as one).
ITEM_WRITES = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")


def serialize_item_writes() -> None:
    lock = threading.RLock()

    def serialized(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return method(*args, **kwargs)

        return locked

    for name in ITEM_WRITES:
        setattr(DynamoDBBackend, name, serialized(getattr(DynamoDBBackend, name)))


def cheap_sqs_scans(patch: Callable[[Any, str, Any], None] = setattr) -> None:
    """moto's SQS with its per-message costs independent of the queue's depth; ``patch`` sets each replacement
    (``setattr``; a test passes its monkeypatch)."""

    def is_message_valid_based_on_retention_period(self: SQSBackend, queue_name: str, message: Message) -> bool:
        retention_s = int(self.get_queue(queue_name).message_retention_period)
        return retention_s + message.sent_timestamp / 1000 > unix_time()  # type: ignore[operator]

    def messages(self: Queue) -> list[Message]:
        now = unix_time_millis()
        return [m for m in self._messages if now > m.visible_at and not now < m.delayed_until]

    def not_visible(self: Queue) -> int:
        now = unix_time_millis()
        return sum(1 for m in self._messages if not now > m.visible_at)

    def delayed(self: Queue) -> int:
        now = unix_time_millis()
        return sum(1 for m in self._messages if now < m.delayed_until)

    patch(SQSBackend, "is_message_valid_based_on_retention_period", is_message_valid_based_on_retention_period)
    patch(Queue, "messages", property(messages))
    patch(Queue, "approximate_number_of_messages_not_visible", property(not_visible))
    patch(Queue, "approximate_number_of_messages_delayed", property(delayed))


def fair_standard_queues(patch: Callable[[Any, str, Any], None] = setattr) -> None:
    """moto's standard queues as fair queues by message group (this module's docstring); ``patch`` as in
    ``cheap_sqs_scans``, which this wraps when applied after it."""
    visible = Queue.messages.fget

    def messages(self: Queue) -> list[Message]:
        ready = visible(self)
        if self.fifo_queue or len(ready) < 2:
            return ready
        now = unix_time_millis()
        in_flight = collections.Counter(m.group_id for m in self._messages if m.group_id and not now > m.visible_at)
        if not in_flight:
            return ready
        return sorted(ready, key=lambda m: in_flight[m.group_id] if m.group_id else 0)  # stable: sent order within

    patch(Queue, "messages", property(messages))


def list_moto_modules_once() -> None:
    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules


def exit_when_orphaned() -> None:
    """Exit once the process that started this server is gone: it runs in a process group of its own (so that a
    terminal's Ctrl-C reaches only the local runtime), so nothing else would stop it when that runtime is killed."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


if __name__ == "__main__":
    exit_when_orphaned()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    serialize_item_writes()
    cheap_sqs_scans()
    fair_standard_queues()
    list_moto_modules_once()
    main(sys.argv[1:])
