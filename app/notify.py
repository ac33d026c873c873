"""Send a message to every destination in ``NIGHTDESK_NOTIFY``, through Apprise.

The setting is a comma-separated list of Apprise URLs (``json://host/path``,
``mailto://…``, ``slack://…``, ``ntfys://…``): each is checked by Apprise itself when the
settings are built (``check_destinations``), so a malformed one stops any command at start.
``send`` never raises: a destination that does not take the message is logged as an error,
once, named as the operator wrote it with its secrets masked (``shown``), and the caller
learns how many took it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qsl, urlencode

import structlog

from serving.urls import MASK, redact

if TYPE_CHECKING:
    from apprise import NotifyResult

log = structlog.get_logger(__name__)

# Apprise's own levels: they pick the colour or icon a destination shows.
Level = Literal["info", "success", "warning", "failure"]
# What Apprise prints in place of a secret (PrivacyMode.Secret); shown as nightdesk's MASK.
APPRISE_MASK = "****"


@dataclass(frozen=True)
class Message:
    """One notification: a short title, a plain-text body, and how bad the news is."""

    title: str
    body: str
    level: Level = "info"


@dataclass
class Delivery:
    """What ``send`` achieved: destinations that took the message, and why the others did not."""

    sent: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # masked URL -> reason

    @property
    def total(self) -> int:
        return self.sent + len(self.failed)


def split_destinations(text: str) -> list[str]:
    """Split ``NIGHTDESK_NOTIFY`` into URLs at its commas.

    A piece without ``://`` right after a URL with a query string belongs to that query
    (``mailto://…?to=a@x.org,b@x.org``); empty pieces are skipped.
    """
    urls: list[str] = []
    for raw in text.split(","):
        piece = raw.strip()
        if not piece:
            continue
        if "://" not in piece and urls and "?" in urls[-1]:
            urls[-1] += "," + piece
        else:
            urls.append(piece)
    return urls


@contextlib.contextmanager
def _quiet_apprise(level: int = logging.CRITICAL + 1) -> Iterator[None]:
    """Keep Apprise's own log lines (which may quote a URL's parts) out of the output; those
    at ``level`` and above still reach Apprise's capture of each destination's logs."""
    logger = logging.getLogger("apprise")
    before, propagate = logger.level, logger.propagate
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(before)
        logger.propagate = propagate


def check_destinations(urls: list[str]) -> None:
    """Raise ValueError naming the first URL Apprise cannot load (by position and scheme only:
    the URL itself may hold a token or password)."""
    import apprise
    from apprise.manager_plugins import NotificationManager

    known = NotificationManager()
    for position, url in enumerate(urls, 1):
        where = f"destination {position} of {len(urls)}"
        scheme, sep, _ = url.partition("://")
        if not sep or not scheme:
            raise ValueError(f"{where} is not an Apprise URL (scheme://…, e.g. "
                             "json://host/path or mailto://user:<password>@host)")
        if scheme.lower() not in known:
            raise ValueError(f"{where}: Apprise has no service {scheme!r}:// "
                             "(see https://github.com/caronc/apprise/wiki)")
        with _quiet_apprise():
            loaded = apprise.Apprise.instantiate(url)
        if loaded is None:
            raise ValueError(f"{where} ({scheme}://): Apprise cannot load it: a part it "
                             "needs is missing or malformed")


def shown(apprise_url: str, urls: list[str]) -> str:
    """Return a destination as Apprise names it (secrets hidden) in nightdesk's form: the one
    mask (``serving.urls.MASK``), and of its query only the parameters ``urls`` wrote
    (Apprise adds its defaults: ``?method=POST&overflow=upstream&retry=0…``)."""
    base, _, query = apprise_url.partition("?")
    written = {key for url in urls for key, _ in parse_qsl(url.partition("?")[2])}
    kept = [(key, value) for key, value in parse_qsl(query) if key in written]
    text = base + (f"?{urlencode(kept, safe='@,*')}" if kept else "")
    return redact(text).replace(APPRISE_MASK, MASK)


def send(destinations: str, message: Message, timeout_s: float, *,
         log_failures: bool = True) -> Delivery:
    """Send ``message`` to every destination of ``destinations`` (the setting ``notify``).

    Never raises. Every destination is tried within ``timeout_s`` in all; one that refuses,
    fails or times out is in ``Delivery.failed`` (``shown``), and logged at error level
    with Apprise's reason unless the caller prints it itself (``log_failures=False``).
    """
    urls = split_destinations(destinations)
    delivery = Delivery()
    if not urls:
        return delivery
    try:
        import apprise

        with _quiet_apprise(logging.WARNING):
            sender = apprise.Apprise()
            for url in urls:
                sender.add(url)  # checked when the settings were built
            result = sender.notify(message.body, title=message.title,
                                   notify_type=apprise.NotifyType(message.level),
                                   body_format=apprise.NotifyFormat.TEXT,
                                   timeout=timeout_s,
                                   log_level=logging.WARNING)
        with result:
            for service in result:
                if service:
                    delivery.sent += 1
                    continue
                reason = _reason(service)
                destination = shown(service.url, urls) if service.url else service.name
                delivery.failed[destination] = reason
                if log_failures:
                    log.error("notification not delivered", destination=destination,
                              status=service.status.name.lower(), reason=reason,
                              title=message.title)
    except Exception as error:  # a notification must never take down what sent it
        log.error("notification failed", error=f"{type(error).__name__}: {error}",
                  title=message.title)
        delivery.failed.setdefault("(all)", f"{type(error).__name__}: {error}")
    return delivery


def _reason(service: NotifyResult) -> str:
    """Return the last warning or error Apprise logged for one destination, on one line."""
    for entry in reversed(list(service.logs())):
        number = logging.getLevelName(entry.level)  # Apprise keeps the name: "ERROR"
        if isinstance(number, int) and number >= logging.WARNING:
            return " ".join(str(entry.message).split())
    return f"not delivered ({service.status.name.lower()})"
