"""The body of ``POST /v1/files`` as the openai SDK sends it: multipart/form-data with a ``file`` part (the bytes,
and its filename) and a ``purpose`` field. Parsed with the standard library's MIME parser."""

from __future__ import annotations

from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP


class MultipartError(ValueError):
    """A body that is not the multipart form the Files API takes; the message says what to fix."""


@dataclass(frozen=True)
class FileForm:
    filename: str
    data: bytes
    purpose: str


def parse_file_form(content_type: str | None, body: bytes) -> FileForm:
    """The ``file`` and ``purpose`` of a multipart/form-data body; MultipartError when either is missing."""
    if (
        not content_type
        or not content_type.lower().startswith("multipart/form-data")
        or "boundary=" not in content_type
    ):
        raise MultipartError(
            "send the file as multipart/form-data with a 'file' part and a 'purpose' field "
            "(as the openai SDK's files.create does)"
        )
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise MultipartError("the multipart/form-data body could not be read: check its boundary")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str) and name not in fields:
            fields[name] = (part.get_filename(), part.get_payload(decode=True) or b"")
    if "file" not in fields:
        raise MultipartError("file: the form has no 'file' part")
    if "purpose" not in fields:
        raise MultipartError("purpose: the form has no 'purpose' field (use 'batch')")
    filename, data = fields["file"]
    try:
        purpose = fields["purpose"][1].decode("utf-8").strip()
    except UnicodeDecodeError:
        raise MultipartError("purpose: not UTF-8 text") from None
    return FileForm(filename=(filename or "upload.jsonl")[:255], data=data, purpose=purpose)
