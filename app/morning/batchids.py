"""Read batch ids from text: the one parser of every command and page that takes one.

A batch id is a whole number written in ASCII digits (``str.isdigit`` also accepts ``²`` and
``١٢``) no larger than the database's signed 64-bit key. Anything else is an InputError
naming the option, so the CLI prints one line and exits 2 instead of a traceback from
``int()`` or from the database driver.
"""

from __future__ import annotations

import re

from app.errors import InputError

MAX_BATCH_ID = 2**63 - 1  # BIGINT in PostgreSQL, INTEGER in SQLite: both signed 64-bit
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def parse_batch_id(text: str, *, what: str = "--batch") -> int:
    """Return the batch id ``text`` names; InputError (naming ``what``) for anything else."""
    value = text.strip()
    if not _DIGITS.fullmatch(value):
        raise InputError(f"{what} takes a batch id, a whole number like 12 (got {text!r})")
    number = int(value)
    if number > MAX_BATCH_ID:
        raise InputError(f"{what}: {value} is beyond any batch id (at most {MAX_BATCH_ID})")
    return number


def parse_batch_ids(text: str, *, what: str = "--batches", at_least: int = 2) -> list[int]:
    """Parse ``A,B[,C…]`` into at least ``at_least`` distinct batch ids; InputError otherwise."""
    parts = text.split(",")
    if not all(p.strip() for p in parts):  # "1,,2" was read as 1,2: an id left out unsaid
        raise InputError(f"{what} has an empty item between its commas ({text!r}): give batch "
                         "ids separated by commas, like 3,4")
    try:
        ids = [parse_batch_id(p, what=what) for p in parts]
    except InputError:
        raise InputError(f"{what} takes batch ids separated by commas, like 3,4, each a whole "
                         f"number up to {MAX_BATCH_ID} (got {text!r})") from None
    if len(set(ids)) != len(ids):
        raise InputError(f"{what} names a batch twice ({text!r})")
    if len(ids) < at_least:
        raise InputError(f"{what} needs at least {at_least} batch ids (got {text!r})")
    return ids
