"""Hand each request what the app was built with: database engine, guard, rerun queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBasicCredentials
from sqlalchemy import Engine

from app.config import Settings
from app.web.auth import Guard, basic
from app.web.reruns import RerunQueue


@dataclass
class WebState:
    """Everything the handlers share; built once by ``create_app``."""

    engine: Engine
    guard: Guard
    reruns: RerunQueue
    stale_after_s: float  # a running batch's heartbeat older than this: probably dead
    settings: Settings  # the schedule and heartbeat ages the night's status reads


def web_state(request: Request) -> WebState:
    state: WebState = request.app.state.web
    return state


State = Annotated[WebState, Depends(web_state)]


def require_user(
    state: State, credentials: Annotated[HTTPBasicCredentials | None, Depends(basic)]
) -> str:
    """Let the request in with valid basic-auth credentials (or when no password is set)."""
    return state.guard.require_user(credentials)
