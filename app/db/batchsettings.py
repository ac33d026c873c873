"""What a batch records about how it ran (``batches.settings``, JSON): one model, versioned.

Every writer builds a ``BatchSettings`` and stores ``stored()``; every reader takes a row's
JSON through ``BatchSettings.read``. Version 2 (this one) stores ``schema_version``. A row
without it was written before (version 1: the same keys, unchecked, any of them absent, as
every older nightdesk wrote them) and reads as it is, a key it lacks at its default. The
keys stay where version 1 put them, flat beside the settings' snapshot: the docs and an
operator's queries name them (``batches.settings.runner``), and a version 1 reader (a
rollback) reads a version 2 row as its own, so neither way needs a migration. Keys this
version does not know are kept as they came (a newer version's, read by this one).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
)

from app.config import SettingsSnapshot
from app.db.runner import Runner

SCHEMA_VERSION = 2
# A moment as version 1 stored it (``isoformat``: "+00:00", not pydantic's "Z"), so a row
# read and written back keeps what it said.
Moment = Annotated[datetime, PlainSerializer(datetime.isoformat, return_type=str,
                                             when_used="json")]


class Outage(BaseModel):
    """An endpoint's time without an answer during the batch (``seconds``: None while it
    was still down at the batch's end)."""

    endpoint: str
    start: Moment
    seconds: float | None = None


class FallbackRecord(BaseModel, frozen=True):
    """A batch's time without /metrics, shown by ``nightdesk report``."""

    readings_missed: int
    seconds: float
    limit: int  # the request limit held meanwhile


class BatchSettings(SettingsSnapshot):
    """A batch's settings: its last run's snapshot of the settings (``SettingsSnapshot``)
    and what the batch itself records beside them."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = 1  # 1: a row written before the version was stored
    samples: int | None = None
    strategy: str | None = None
    universe_notes: list[str] = Field(default_factory=list)
    # Whether it ran on the DEMO snapshot: every surface labels it so.
    demo_data: bool = False
    home: str | None = None  # the last run's data home: where its usage spool would be
    runner: Runner | None = None  # the process that last ran it
    resumes: list[Moment] = Field(default_factory=list)  # when each resume reopened it
    server_outages: list[Outage] = Field(default_factory=list)
    # Endpoint -> the weights it served (its /v1/models root).
    served_weights: dict[str, str] = Field(default_factory=dict)
    metrics_fallback: FallbackRecord | None = None

    @field_validator("runner", mode="wrap")
    @classmethod
    def _runner_or_none(cls, value: Any, handler: Any) -> Runner | None:
        # A runner recorded otherwise (by hand, or cut short) names no process: as none.
        try:
            return handler(value)
        except ValidationError:
            return None

    @classmethod
    def read(cls, raw: Mapping[str, Any] | None) -> BatchSettings:
        """Return a row's settings, of any version (NULL reads as none recorded)."""
        return cls.model_validate(dict(raw or {}))

    def updated(self, **changes: Any) -> BatchSettings:
        """Return these settings with ``changes`` (by key) over them, checked."""
        return self.read({**self.model_dump(exclude_unset=True), **changes})

    def stored(self) -> dict[str, Any]:
        """Return the JSON to store: the keys recorded, at this version."""
        return {**self.model_dump(mode="json", exclude_unset=True),
                "schema_version": SCHEMA_VERSION}
