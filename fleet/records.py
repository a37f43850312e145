"""Stored records across releases: the schema version and the tolerant reader.

Everything the fleet keeps in Redis or sends in a task message is read, during a rolling
upgrade, by the release before this one and the release after it (docs/operations.md,
"Upgrading"). A `Record` follows three rules:

- **Unknown fields are kept.** A field a newer release added is read into the model's
  extras and written back with it when the record is rewritten whole (a collaborator
  entry, a memory entry); records updated field by field (the trace hash) never touch it.
- **Missing fields take their defaults**, so a record an older release wrote reads here.
- **A field added since the previous release is written only when it says something** (not
  at its default), and the record then carries `schema_version`: the oldest schema that
  reads it right. A record without one is schema 1 (release 0.1.0, which refuses any field
  it does not know: so what this release writes by default must carry no field 0.1.0 lacks).
  A reader older than a record's `schema_version` refuses that record, one line
  (`NewerRecord`), and nothing else.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from fleet.errors import FleetError

SCHEMA_VERSION = 2
"""The record schema this release writes and reads: 1 was release 0.1.0's (no version on any
record), 2 adds `schema_version` where a record needs it, the trace's memory namespaces and
unknown fields kept."""

UNVERSIONED = 1
"""The schema of a record that carries no `schema_version`."""

TASK_SCHEMA = 1
"""The oldest schema that runs this release's task messages right (their `fleet_schema`
header): their arguments have not changed since release 0.1.0. A task argument added later
must be one an older worker may ignore (the tasks take `**newer`), or raise this."""


def newer_than_this(schema: object) -> bool:
    """Whether a record's or a message's schema is above the one this release reads."""
    return isinstance(schema, int) and schema > SCHEMA_VERSION


class NewerRecord(FleetError):
    """A record written for a newer release than this one reads (its `schema_version`)."""


class Kept(BaseModel):
    """A value inside a stored record: the fields this release does not know are kept."""

    model_config = ConfigDict(extra="allow")


class Record(Kept):
    """A stored record: unknown fields kept, new fields written only when set.

    `SINCE` names the fields added after schema 1 and the schema that added each.
    """

    SINCE: ClassVar[dict[str, int]] = {}

    schema_version: int = UNVERSIONED
    """The oldest schema that reads this record right; written only when above 1."""

    @model_validator(mode="after")
    def _readable(self) -> Record:
        if self.schema_version > SCHEMA_VERSION:
            raise NewerRecord(
                f"a {type(self).__name__} written by a newer release (schema"
                f" {self.schema_version}; this one reads up to {SCHEMA_VERSION}): upgrade it"
            )
        return self

    @model_serializer(mode="wrap")
    def _written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        floor = self.schema_version
        for name, since in self.SINCE.items():
            if name not in data:
                continue
            if getattr(self, name) == type(self).model_fields[name].get_default(
                call_default_factory=True
            ):
                del data[name]  # at its default: an older reader lacks nothing
            else:
                floor = max(floor, since)
        data.pop("schema_version", None)
        if floor > UNVERSIONED:
            data["schema_version"] = floor
        return data


def unknown_fields(record: BaseModel) -> list[str]:
    """The fields of `record` and its nested records that this release does not know."""
    found = [f"{name!r}" for name in record.model_extra or {}]
    for name in type(record).model_fields:
        value = getattr(record, name)
        nested = value if isinstance(value, list) else [value]
        found += [
            f"{name}.{inner}"
            for v in nested
            if isinstance(v, BaseModel)
            for inner in unknown_fields(v)
        ]
    return found
