"""Run every step of a batch's cleanup, whatever the steps before it did."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger(__name__)

Step = tuple[str, Callable[[], Awaitable[object]] | None]


async def run_all(steps: list[Step]) -> list[tuple[str, BaseException]]:
    """Await each step in order; return what failed, as (step, error), instead of stopping.

    A batch's end is a chain of closings (heartbeat, sampler, usage recorder, client)
    before its status is written: one that raises must not keep the others, or the
    status, from happening. Even a cancellation is held until every step has run.
    """
    failed: list[tuple[str, BaseException]] = []
    for name, step in steps:
        if step is None:
            continue
        try:
            await step()
        except BaseException as error:  # reported to the caller, never lost
            log.error("cleanup step failed", step=name, error=f"{type(error).__name__}: {error}")
            failed.append((name, error))
    return failed


def describe(failed: list[tuple[str, BaseException]]) -> str:
    """Return one line naming each failed step and its error."""
    return "; ".join(f"cleanup: {name}: {type(error).__name__}: {error}"
                     for name, error in failed)[:500]


def reraise(failed: list[tuple[str, BaseException]], *, body_ok: bool) -> None:
    """Raise what cleanup met: a cancellation always; an error when nothing else is raised."""
    for _, error in failed:
        if not isinstance(error, Exception):
            raise error
    if failed and body_ok:
        raise failed[0][1]
