"""``python -m local_runtime.moto_main``: moto's server without werkzeug's access log, and with DynamoDB's per-item
atomicity.

werkzeug logs every request at INFO; with the output thrown away that was still about a fifth of the server's CPU in
the soak (py-spy), and moto serves the whole local stack from one process. Warnings and errors still go to stderr.

moto's server answers each request on a thread of its own, and its DynamoDB applies a write in steps on the live item:
two UpdateItems of one item at once could lose a number ADD while keeping both set members (a batch counted
``completed`` with 20 of its 120 lines, tests/local/test_moto_atomicity.py). DynamoDB applies each write to an item
atomically, so here the DynamoDB backend's writes take one lock.
"""

import functools
import logging
import sys
import threading
from typing import Any, Callable

from moto.dynamodb.models import DynamoDBBackend
from moto.server import main

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


if __name__ == "__main__":
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    serialize_item_writes()
    main(sys.argv[1:])
