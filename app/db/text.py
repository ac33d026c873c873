"""Keep text storable in PostgreSQL (no NUL characters, no lone UTF-16 surrogates) and safe
to show (no URL's password)."""

from __future__ import annotations

import re

from sqlalchemy import Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from serving.urls import redact

# A model's reply can carry either: a JSON "\u0000" or "\ud800" escape in the stream decodes
# to one. PostgreSQL text (and jsonb) rejects NUL; a lone surrogate cannot even be encoded
# as UTF-8, so the driver fails before the server sees it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """Return ``text`` without NUL characters, lone surrogates replaced by U+FFFD."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    return _SURROGATE.sub("\ufffd", text)


class CleanText(TypeDecorator[str]):
    """Store text through ``storable`` and ``redact``, whatever wrote it (LLM replies, error
    messages: an error may quote the URL it failed on)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else redact(storable(value))
