"""The Files and Batches APIs' side of a batch: what the API does with files and batches, whoever called it.

Tenant-scoped throughout: another tenant's file or batch is a 404, exactly as an unknown id is, so ids cannot be
probed. Errors are ``ServiceError``s (the API turns them into ``{"error": {...}}`` responses).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from async_inference import settings
from async_inference.batches.aws import ControlQueue, FileObjects
from async_inference.batches.models import (
    Batch,
    BatchCreate,
    BatchRecord,
    BatchStatus,
    FileDeleted,
    FileObject,
    FileRecord,
    FileUpload,
    FileUploadRequest,
    Model,
    ModelList,
    Page,
    PresignedFileUpload,
    epoch,
    new_batch_id,
    new_file_id,
)
from async_inference.batches.store import BatchStore, InvalidCursor
from async_inference.config import ServiceSettings
from async_inference.jobs_service import ErrorKind, ServiceError
from async_inference.quotas import TenantQuota, batch_lines_message, stored_bytes_message
from async_inference.schemas import BatchControl, WebhookState, utcnow
from async_inference.served_models import OWNED_BY, ServedModels
from async_inference.webhooks.url_safety import UnsafeUrl, check_url

CANCELLABLE = frozenset({BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS})


def _invalid(
    field: str, message: str, kind: ErrorKind = ErrorKind.INVALID, code: str = "invalid_request"
) -> ServiceError:
    return ServiceError(kind, code, f"{field}: {message}", [{"field": field, "message": message}])


class BatchService:
    def __init__(
        self,
        *,
        store: BatchStore,
        files: FileObjects,
        control: ControlQueue,
        served: ServedModels,
        started_at: int | None = None,
        allow_local_webhooks: bool = False,
        quotas: Mapping[str, TenantQuota] | None = None,
    ) -> None:
        self.store = store
        # None: no quotas; a tenant missing from it gets the defaults (async_inference.quotas).
        self.quotas = quotas
        self.allow_local_webhooks = allow_local_webhooks
        self.files = files
        self.control = control
        self.served = served
        self.started_at = started_at if started_at is not None else epoch(utcnow())

    @classmethod
    def from_settings(cls, config: ServiceSettings) -> BatchService | None:
        """The service over the resources the settings name; None when the stack has no batches configured."""
        if not config.batch_table_name or not config.batch_control_queue_url:
            return None
        return cls(
            store=BatchStore(config.batch_table_name),
            files=FileObjects(config.bucket_name),
            control=ControlQueue(config.batch_control_queue_url),
            served=ServedModels.of(config.served_models),
            allow_local_webhooks=config.allow_local_webhooks,
            quotas=config.tenant_quotas,
        )

    # --- models ---------------------------------------------------------------------------------------------------

    def models(self) -> ModelList:
        """The served models in OpenAI's list shape (``created``: when this API instance started, as vLLM answers)."""
        return ModelList(
            data=[Model(id=name, created=self.started_at, owned_by=OWNED_BY) for name in self.served.names]
        )

    def model(self, model_id: str) -> Model:
        if model_id not in self.served.names:
            raise ServiceError(ErrorKind.NOT_FOUND, "model_not_found", self.served.not_found_message(model_id))
        return Model(id=model_id, created=self.started_at, owned_by=OWNED_BY)

    # --- files ----------------------------------------------------------------------------------------------------

    def create_file(self, tenant: str, *, filename: str, purpose: str, data: bytes) -> FileObject:
        """A file sent in the request itself (``POST /v1/files``)."""
        self._check_purpose(purpose)
        if not data:
            raise _invalid("file", "the file is empty")
        if len(data) > settings.MAX_FILE_INLINE_BYTES:
            raise ServiceError(
                ErrorKind.TOO_LARGE,
                "payload_too_large",
                f"file: {len(data)} bytes is over the {settings.MAX_FILE_INLINE_BYTES} bytes POST /v1/files "
                "takes through API Gateway and Lambda; use POST /v1/files/uploads (a presigned PUT, up to "
                f"{settings.BATCH_MAX_FILE_BYTES} bytes)",
            )
        self._check_stored_bytes(tenant, len(data))
        record = self._new_file(tenant, filename=filename, purpose=purpose, size=len(data))
        self.files.put(record.key, data)  # the bytes before the record: no file is ever listed without its bytes
        self.store.create(record)
        return record.wire()

    def create_upload(self, tenant: str, request: FileUploadRequest) -> FileUpload:
        """A file whose bytes the client PUTs to a presigned URL (the extension for files over the inline limit)."""
        expires_s = settings.PRESIGNED_UPLOAD_EXPIRY_S
        self._check_stored_bytes(tenant, request.bytes)  # the announced size: S3 refuses any other
        record = self._new_file(
            tenant,
            filename=request.filename,
            purpose=request.purpose,
            size=request.bytes,
            upload_expires_at=utcnow() + dt.timedelta(seconds=expires_s),
        )
        record = record.model_copy(update={"key": settings.file_upload_key(tenant, record.id)})
        self.store.create(record)  # before the URL exists: an upload's event always finds its record, or none
        url, headers = self.files.presign_put(record.key, size_bytes=request.bytes, expires_s=expires_s)
        upload = PresignedFileUpload(url=url, headers=headers, expires_at=epoch(record.upload_expires_at or utcnow()))
        return FileUpload(**record.wire().model_dump(), upload=upload)

    def get_file(self, tenant: str, file_id: str) -> FileRecord:
        record = self.store.get_file(file_id)
        if record is None or record.tenant != tenant:
            raise ServiceError(ErrorKind.NOT_FOUND, "not_found", f"No such File object: {file_id}")
        if record.awaiting_upload:
            record = self._confirm_upload(record)
        return record

    def list_files(
        self, tenant: str, *, after: str | None, limit: int, order: str, purpose: str | None
    ) -> Page[FileObject]:
        records = self._list(tenant, "file", after=after, limit=limit, ascending=order == "asc", purpose=purpose)
        return self._page([r.wire() for r in records[0]], records[1])  # type: ignore[union-attr]

    def content_url(self, tenant: str, file_id: str) -> str:
        """A presigned GET of the file's bytes (the API redirects there: a Lambda answer holds at most 6 MB)."""
        record = self.get_file(tenant, file_id)
        if record.awaiting_upload:
            raise ServiceError(
                ErrorKind.CONFLICT, "conflict", f"file {file_id} has no content yet: its upload has not arrived"
            )
        return self.files.presign_get(
            record.key, expires_s=settings.PRESIGNED_RESULT_EXPIRY_S, filename=record.filename
        )

    def delete_file(self, tenant: str, file_id: str) -> FileDeleted:
        """Delete a file's record, then its bytes. A presigned PUT cannot be revoked: bytes it puts after this are
        deleted when their upload event finds no record (``uploaded``)."""
        record = self.get_file(tenant, file_id)
        self.store.delete(record.id)  # the record first: a crash in between leaves bytes that the lifecycle expires
        self.files.delete(record.key)
        return FileDeleted(id=file_id, deleted=True)

    def uploaded(self, key: str) -> FileRecord | None:
        """A presigned file upload's object arrived (its S3 event): the file it belongs to, or None when no file
        waits for these bytes (deleted before they arrived, or never one of this tenant's), and the object is
        deleted: nothing stays stored that no record counts against its tenant's ``max_stored_bytes``."""
        parsed = settings.parse_file_upload_key(key)
        record = self.store.get_file(parsed[1]) if parsed is not None else None
        if record is None or parsed is None or record.tenant != parsed[0] or record.key != key:
            self.files.delete(key)
            return None
        return record

    # --- batches --------------------------------------------------------------------------------------------------

    def create_batch(self, tenant: str, request: BatchCreate) -> Batch:
        if request.webhook is not None:
            try:
                # The dispatcher checks again before every delivery; checked here too so the client learns it at once.
                check_url(request.webhook.url, allow_local=self.allow_local_webhooks)
            except UnsafeUrl as exc:
                raise _invalid("webhook.url", str(exc)) from exc
        try:
            source = self.get_file(tenant, request.input_file_id)
        except ServiceError as exc:
            raise _invalid(
                "input_file_id", f"no file {request.input_file_id}", ErrorKind.NOT_FOUND, "not_found"
            ) from exc
        if source.purpose != "batch":
            raise _invalid(
                "input_file_id",
                f"file {source.id} has purpose {source.purpose!r}; a batch's input file "
                "must be uploaded with purpose 'batch'",
            )
        if source.awaiting_upload:
            raise _invalid(
                "input_file_id", f"file {source.id} has not been uploaded yet: PUT its bytes to the presigned URL first"
            )
        self._check_lines_in_flight(tenant)
        batch_id = new_batch_id()
        input_key = settings.batch_input_key(tenant, batch_id)
        try:
            self.files.copy(source.key, input_key)
        except KeyError as exc:
            raise _invalid(
                "input_file_id", f"file {source.id} has no content (deleted?)", ErrorKind.NOT_FOUND, "not_found"
            ) from exc
        now = utcnow()
        record = BatchRecord(
            id=batch_id,
            tenant=tenant,
            created_at=now,
            status=BatchStatus.VALIDATING,
            endpoint=request.endpoint,
            input_file_id=source.id,
            input_key=input_key,  # the batch's own copy: a re-PUT of the file's presigned URL cannot change it
            completion_window=request.completion_window,
            deadline=now + dt.timedelta(seconds=settings.BATCH_COMPLETION_WINDOWS[request.completion_window]),
            metadata=request.metadata,
            webhook=WebhookState(url=request.webhook.url, events=list(request.webhook.events))
            if request.webhook
            else None,
        )
        self.store.create(record)
        try:
            self.control.send(BatchControl(kind="plan", batch_id=record.id, tenant=tenant))
        except Exception as exc:
            # Stored but not planned: end it with a reason rather than leave it validating forever.
            self.store.transition(
                record.id,
                BatchStatus.FAILED,
                errors=[
                    {"code": "unavailable", "message": "the batch could not be queued for validation; create it again"}
                ],
            )
            raise ServiceError(
                ErrorKind.UNAVAILABLE, "unavailable", "the batch control queue is unavailable; retry the request"
            ) from exc
        return record.wire()

    def get_batch(self, tenant: str, batch_id: str) -> BatchRecord:
        record = self.store.get_batch(batch_id)
        if record is None or record.tenant != tenant:
            raise ServiceError(ErrorKind.NOT_FOUND, "not_found", f"No such Batch object: {batch_id}")
        return record

    def list_batches(self, tenant: str, *, after: str | None, limit: int) -> Page[Batch]:
        records, more = self._list(tenant, "batch", after=after, limit=limit)
        return self._page([r.wire() for r in records], more)  # type: ignore[union-attr]

    def cancel_batch(self, tenant: str, batch_id: str) -> Batch:
        """Move the batch to ``cancelling``: workers abort its running lines and skip the rest at their next
        heartbeat, and the last chunk counted finalizes it ``cancelled`` (its finished lines in the output file)."""
        record = self.get_batch(tenant, batch_id)
        if record.status is BatchStatus.CANCELLING:
            return record.wire()
        if record.status not in CANCELLABLE:
            raise ServiceError(
                ErrorKind.CONFLICT, "conflict", f"batch {batch_id} is {record.status.value} and cannot be cancelled"
            )
        cancelled = self.store.transition(batch_id, BatchStatus.CANCELLING)
        if cancelled is None:  # it moved on between our read and our write
            record = self.get_batch(tenant, batch_id)
            if record.status is BatchStatus.CANCELLING:
                return record.wire()
            raise ServiceError(
                ErrorKind.CONFLICT, "conflict", f"batch {batch_id} is {record.status.value} and cannot be cancelled"
            )
        return cancelled.wire()

    # --- helpers --------------------------------------------------------------------------------------------------

    def _quota(self, tenant: str) -> TenantQuota | None:
        return None if self.quotas is None else self.quotas.get(tenant, TenantQuota())

    def _check_stored_bytes(self, tenant: str, adding: int) -> None:
        """429 quota_exceeded when ``adding`` bytes more would take the tenant's files past ``max_stored_bytes``."""
        quota = self._quota(tenant)
        if quota is None:
            return
        limit = quota.max_stored_bytes
        stored = self.store.stored_bytes(tenant, up_to=limit)
        if stored + adding > limit:
            message = stored_bytes_message(tenant, limit, stored, adding)
            raise ServiceError(
                ErrorKind.QUOTA, "quota_exceeded", message, [{"field": "max_stored_bytes", "message": message}]
            )

    def _check_lines_in_flight(self, tenant: str) -> None:
        """429 quota_exceeded when the tenant's batches in flight hold ``max_batch_lines_in_flight`` lines already
        (the new batch's own lines are counted by the controller, once it has read them)."""
        quota = self._quota(tenant)
        if quota is None:
            return
        limit = quota.max_batch_lines_in_flight
        in_flight = self.store.lines_in_flight(tenant, up_to=limit)
        if in_flight >= limit:
            message = batch_lines_message(tenant, limit, in_flight)
            raise ServiceError(
                ErrorKind.QUOTA, "quota_exceeded", message, [{"field": "max_batch_lines_in_flight", "message": message}]
            )

    @staticmethod
    def _check_purpose(purpose: str) -> None:
        if purpose not in settings.FILE_PURPOSES:
            raise _invalid(
                "purpose", f"{purpose!r} is not supported here; use one of {', '.join(settings.FILE_PURPOSES)}"
            )

    @staticmethod
    def _new_file(
        tenant: str, *, filename: str, purpose: str, size: int, upload_expires_at: dt.datetime | None = None
    ) -> FileRecord:
        now = utcnow()
        file_id = new_file_id()
        return FileRecord(
            id=file_id,
            tenant=tenant,
            created_at=now,
            bytes=size,
            filename=filename,
            purpose=purpose,  # type: ignore[arg-type]
            key=settings.file_key(tenant, file_id),
            expires_at=now + dt.timedelta(days=settings.FILE_RETENTION_DAYS),
            upload_expires_at=upload_expires_at,
        )

    def _confirm_upload(self, record: FileRecord) -> FileRecord:
        """A presigned upload counts once its object is there with the announced size (S3 refuses another size: the
        size is signed); until then the file stays awaiting it."""
        if self.files.size(record.key) != record.bytes:
            return record
        return self.store.confirm_upload(record.id) or record

    def _list(
        self,
        tenant: str,
        kind: str,
        *,
        after: str | None,
        limit: int,
        ascending: bool = False,
        purpose: str | None = None,
    ) -> tuple[list, bool]:  # type: ignore[type-arg]
        try:
            return self.store.list(tenant, kind, limit=limit, after=after, ascending=ascending, purpose=purpose)  # type: ignore[arg-type]
        except InvalidCursor as exc:
            raise _invalid("after", f"no {kind} {after} of yours to list after") from exc

    @staticmethod
    def _page(items: list, more: bool) -> Page:  # type: ignore[type-arg]
        return Page(
            data=items, first_id=items[0].id if items else None, last_id=items[-1].id if items else None, has_more=more
        )
