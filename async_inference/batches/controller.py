"""The batch controller: plans a batch (validates and chunks its input) and finalizes it (its parts into the output and
error files), each step idempotent, as docs/design/batches.md says.

Plan: ``validating`` -> the input streamed once -> structural errors fail the batch (nothing runs), as do lines that
would take the tenant past its ``max_batch_lines_in_flight`` (async_inference.quotas); or the line count, model and
chunks are recorded, one ``ChunkClaimCheck`` per chunk goes to the batch lane, and the batch moves to
``in_progress``. A redelivered plan sends the chunks again (a chunk's parts are written once and counted once).

Finalize: when every chunk is counted, ``finalizing`` -> the parts concatenated in chunk order into one output file
and one error file (none when there are no errors, as OpenAI) -> ``completed``, ``cancelled`` (the batch was
cancelling) or ``expired`` (a line ended ``batch_expired``) -> the notification. A finalize of a final batch only
re-sends a notification that did not go out.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from async_inference import safe_json, settings
from async_inference.batches import planning
from async_inference.batches.aws import BatchNotifier, ChunkQueue, FileObjects
from async_inference.batches.models import (
    BATCH_EVENTS,
    BatchNotification,
    BatchRecord,
    BatchStatus,
    FileRecord,
    epoch,
    new_file_id,
)
from async_inference.batches.store import BatchStore
from async_inference.config import ENV_BATCH_TABLE, ENV_MODEL_FLEETS, ServiceSettings, SettingsError, WakeSettings
from async_inference.fleets import FleetRoute, kind_of_endpoint, route_of, wrong_kind_message
from async_inference.quotas import TenantQuota, batch_lines_message
from async_inference.schemas import BatchControl, ChunkClaimCheck, utcnow
from async_inference.served_models import ServedModels
from async_inference.wake import ServiceWaker

logger = logging.getLogger(__name__)
EXPIRED_LINE_CODE = "batch_expired"


@dataclass
class _Counted:
    """What a file's concatenation saw: its bytes and lines, and whether a line expired."""

    bytes: int = 0
    lines: int = 0
    expired: bool = False


class BatchController:
    def __init__(
        self,
        *,
        store: BatchStore,
        files: FileObjects,
        notifier: BatchNotifier,
        served: ServedModels,
        fleets: Mapping[str, FleetRoute],
        quotas: Mapping[str, TenantQuota] | None = None,
        wake: WakeSettings | None = None,
    ) -> None:
        self.store = store
        # None: no quotas; a tenant missing from it gets the defaults (async_inference.quotas).
        self.quotas = quotas
        # Each model's batch lane and service (async_inference.fleets): a batch's chunks go to its model's lane, and a
        # model without a route, or whose fleet has no lane, is a batch error.
        self.fleets = dict(fleets)
        # Chunks queued for an idle fleet wake it as a queued job does (None: the scaling alarms start a task).
        self._wake = wake
        self._lanes: dict[str, tuple[ChunkQueue, ServiceWaker | None]] = {}
        self.files = files
        self.notifier = notifier
        self.served = served

    @classmethod
    def from_settings(cls, config: ServiceSettings) -> BatchController:
        """The controller over the resources the settings name, with one set of clients for the process."""
        if not config.batch_table_name or config.model_fleets is None:
            raise SettingsError(f"the batch controller needs {ENV_BATCH_TABLE} and {ENV_MODEL_FLEETS}")
        return cls(
            store=BatchStore(config.batch_table_name),
            files=FileObjects(config.bucket_name),
            notifier=BatchNotifier(config.topic_arn),
            served=ServedModels.of(config.served_models),
            quotas=config.tenant_quotas,
            fleets=config.model_fleets,
            wake=config.wake,
        )

    def handle(self, control: BatchControl) -> BatchRecord | None:
        return self.plan(control.batch_id) if control.kind == "plan" else self.finalize(control.batch_id)

    # --- plan -----------------------------------------------------------------------------------------------------

    def plan(self, batch_id: str) -> BatchRecord | None:
        record = self.store.get_batch(batch_id)
        if record is None:
            return None
        if record.status is BatchStatus.CANCELLING and not record.planned:
            return self.finalize(batch_id)  # cancelled before it was planned: nothing ever runs
        if record.status is not BatchStatus.VALIDATING:
            return record  # planned already (a redelivered message)
        if not record.planned:
            found = self._validate(record)
            if found.ok:
                self._check_lines_in_flight(record, found)
            if not found.ok:
                failed = self.store.transition(batch_id, BatchStatus.FAILED, errors=found.errors)
                if failed is not None:
                    self._notify(failed)
                return failed or self.store.get_batch(batch_id)
            planned = self.store.record_plan(batch_id, total=found.total, model=found.model, chunks=found.chunks)
            if planned is None:  # cancelled meanwhile
                return self.plan(batch_id)
            record = planned
        chunks, waker = self._lane(record.model)
        chunks.send_all(self._claims(record))
        if waker is not None:
            waker.job_queued()  # never raises
        return self.store.transition(batch_id, BatchStatus.IN_PROGRESS) or self.store.get_batch(batch_id)

    def _check_lines_in_flight(self, record: BatchRecord, found: planning.Plan) -> None:
        """An error on ``found`` when its lines would take the tenant past ``max_batch_lines_in_flight``: the lines of
        its other batches in flight (this one's are not recorded yet) plus these."""
        if self.quotas is None:
            return
        limit = self.quotas.get(record.tenant, TenantQuota()).max_batch_lines_in_flight
        in_flight = self.store.lines_in_flight(record.tenant, up_to=limit)
        if in_flight + found.total > limit:
            message = batch_lines_message(record.tenant, limit, in_flight, adding=found.total)
            found.errors.append(
                planning.BatchError(code="quota_exceeded", message=message, param="max_batch_lines_in_flight")
            )

    def _lane(self, model: str | None) -> tuple[ChunkQueue, ServiceWaker | None]:
        """The batch lane and waker of ``model``'s fleet (its route, checked when the batch was validated)."""
        route = route_of(self.fleets, model) if model else None
        if route is None or not route.batch_queue_url:
            raise ValueError(f"no fleet with a batch lane serves the model {model!r}: MODEL_FLEETS has no lane for it")
        if model not in self._lanes:
            target = self._wake.target(route) if self._wake is not None else None
            waker = ServiceWaker.for_target(target) if target is not None else None
            self._lanes[model] = (ChunkQueue(route.batch_queue_url), waker)
        return self._lanes[model]

    def _validate(self, record: BatchRecord) -> planning.Plan:
        try:
            found = planning.plan(self.files.stream(record.input_key), served=self.served, endpoint=record.endpoint)
        except KeyError:
            found = planning.Plan()
            found.errors.append(
                planning.BatchError(
                    code="file_not_found", message=f"the input file {record.input_file_id} has no content (deleted?)"
                )
            )
            return found
        if found.ok and found.model:
            lane = route_of(self.fleets, found.model)
            if lane is None or lane.batch_queue_url is None:
                found.errors.append(
                    planning.BatchError(
                        code="model_not_found",
                        message=f"{self.served.not_found_message(found.model)} (no fleet with a batch lane serves it)",
                        param="body.model",
                    )
                )
        route = self.fleets.get(found.model) if found.ok and found.model else None
        wanted = kind_of_endpoint(record.endpoint)
        if route is not None and route.kind != wanted:
            assert found.model is not None
            found.errors.append(
                planning.BatchError(
                    code="model_kind_mismatch",
                    message=wrong_kind_message(found.model, route.kind, wanted),
                    param="body.model",
                )
            )
        return found

    def _claims(self, record: BatchRecord) -> list[ChunkClaimCheck]:
        return [
            ChunkClaimCheck(
                batch_id=record.id,
                tenant=record.tenant,
                bucket=self.files.bucket,
                input_key=record.input_key,
                chunk=index,
                start_byte=chunk.start_byte,
                end_byte=chunk.end_byte,
                first_line=chunk.first_line,
                line_count=chunk.line_count,
                model=record.model,
                deadline=record.deadline,
                timeout_s=settings.DEFAULT_EXECUTION_TIMEOUT_S,
            )
            for index, chunk in enumerate(record.chunks)
        ]

    # --- finalize -------------------------------------------------------------------------------------------------

    def finalize(self, batch_id: str) -> BatchRecord | None:
        record = self.store.get_batch(batch_id)
        if record is None:
            return None
        if record.status.is_final:
            if not record.notified:
                self._notify(record)  # ended by an earlier delivery whose notification did not go out
            return record
        unplanned_cancel = record.status is BatchStatus.CANCELLING and not record.planned
        if not (record.all_counted or unplanned_cancel):
            logger.info("finalize of %s before its chunks are counted: ignored", batch_id)
            return record
        finalizing = self.store.transition(batch_id, BatchStatus.FINALIZING)
        if finalizing is None:
            return self.store.get_batch(batch_id)
        outputs = self._write_file(finalizing, "output")
        errors = self._write_file(finalizing, "error")
        if finalizing.cancelling_at is not None:
            target = BatchStatus.CANCELLED
        elif errors is not None and errors[1].expired:
            target = BatchStatus.EXPIRED
        else:
            target = BatchStatus.COMPLETED
        final = self.store.transition(
            batch_id,
            target,
            output_file_id=outputs[0].id if outputs else None,
            error_file_id=errors[0].id if errors else None,
        )
        if final is not None:
            self._notify(final)
        return final or self.store.get_batch(batch_id)

    def _write_file(self, record: BatchRecord, kind: str) -> tuple[FileRecord, _Counted] | None:
        """One file of the batch (``output`` or ``error``) from its chunks' parts, in chunk order; None when it would
        be empty (an error file with no errors, or nothing finished). Its id is derived from the batch's, so a
        finalize that runs again writes the same file."""
        counted = _Counted()
        file_id = new_file_id(f"{record.id}/{kind}")
        key = settings.file_key(record.tenant, file_id)
        self.files.write_stream(key, self._parts(record, kind, counted))
        if counted.lines == 0:
            self.files.delete(key)
            return None
        now = utcnow()
        file = FileRecord(
            id=file_id,
            tenant=record.tenant,
            created_at=now,
            bytes=counted.bytes,
            purpose="batch_output",
            filename=f"{record.id}_{kind}.jsonl",
            key=key,
            expires_at=now + dt.timedelta(days=settings.FILE_RETENTION_DAYS),
        )
        self.store.create(file)  # False on a second finalize: the record is there already
        return file, counted

    def _parts(self, record: BatchRecord, kind: str, counted: _Counted) -> Iterator[bytes]:
        for chunk in range(record.chunk_count or 0):
            data = self.files.read(settings.batch_part_key(record.tenant, record.id, chunk, kind))
            if data is None:
                logger.warning("batch %s chunk %d has no %s part; counted as empty", record.id, chunk, kind)
                continue
            if data and not data.endswith(b"\n"):
                data += b"\n"
            for line in data.splitlines():
                if not line.strip():
                    continue
                counted.lines += 1
                if kind == "error" and not counted.expired:
                    counted.expired = _is_expired(line)
            counted.bytes += len(data)
            yield data

    # --- notifications --------------------------------------------------------------------------------------------

    def _notify(self, record: BatchRecord) -> None:
        """Publish the batch's end, then record that it went out (a crash in between re-sends it: subscribers see it at
        least once and dedupe on the event id, which is the same for every send)."""
        event = BATCH_EVENTS[record.status]
        self.notifier.publish(
            BatchNotification(
                id=f"evt_{record.id.removeprefix('batch_')}",
                type=event,  # type: ignore[arg-type]
                created_at=epoch(utcnow()),
                data={"id": record.id},
                tenant=record.tenant,
                batch=record.wire(),
            ),
            has_webhook=record.webhook is not None and event in record.webhook.events,
        )
        self.store.mark_notified(record.id)


def _is_expired(line: bytes) -> bool:
    try:
        parsed = safe_json.loads(line)
    except ValueError:
        return False
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return isinstance(error, dict) and error.get("code") == EXPIRED_LINE_CODE
