"""The two kinds of wire model, and the schema version every message carries."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION: Literal["1"] = "1"


class StrictModel(BaseModel):
    """Input the API validates: unknown fields are errors, and no silent type coercion ("5" is not an int)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TolerantModel(BaseModel):
    """What one component tells another: unknown fields are tolerated, so that a newer sender does not break an older
    reader (a rolling deploy, or a client older than the server)."""

    model_config = ConfigDict(extra="ignore")
