"""Guard the web pages: HTTP basic auth for every page, and a CSRF token for every form POST.

The browser resends basic-auth credentials on any request to the site, including one a
foreign page makes it send, so a state-changing POST also needs proof that it came from
our own form: a random per-browser token, kept in a cookie signed with a per-process key
(itsdangerous) and repeated in the form ("signed double submit"). A foreign page can make
the browser send the cookie but cannot read it to put in the form.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Response, status
from fastapi.security import HTTPBasic, HTTPBasicCredentials
from itsdangerous import BadSignature, URLSafeSerializer

CSRF_COOKIE = "nightdesk_csrf"
CSRF_FIELD = "csrf_token"

basic = HTTPBasic(realm="nightdesk", auto_error=False)


class Guard:
    """Check credentials and CSRF tokens; without a password every request is let in."""

    def __init__(self, user: str, password: str | None, secret: bytes | None = None) -> None:
        self.user = user
        self.password = password
        self._signer = URLSafeSerializer(secret or secrets.token_bytes(32), salt="csrf")

    def require_user(
        self, credentials: Annotated[HTTPBasicCredentials | None, Depends(basic)]
    ) -> str:
        """Return the signed-in user, or answer 401 with a basic-auth challenge."""
        if not self.password:
            return "local"
        if credentials is not None:
            # Both comparisons always run, so timing does not tell which part was wrong.
            user_ok = secrets.compare_digest(credentials.username.encode(), self.user.encode())
            password_ok = secrets.compare_digest(credentials.password.encode(),
                                                 self.password.encode())
            if user_ok and password_ok:
                return credentials.username
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "credentials required",
                            headers={"WWW-Authenticate": 'Basic realm="nightdesk"'})

    def csrf_token(self, request: Request) -> str:
        """Return the browser's CSRF token for a form: its cookie's, or a new signed one."""
        cookie = request.cookies.get(CSRF_COOKIE)
        if cookie and self._valid(cookie):
            return cookie
        return self._signer.dumps(secrets.token_urlsafe(24))

    @staticmethod
    def remember(response: Response, token: str) -> None:
        """Set the token's cookie on the response that carries the form."""
        response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path="/")

    def check_csrf(self, request: Request, submitted: str | None) -> None:
        """Answer 403 unless the form's token equals the cookie's and the cookie is ours."""
        cookie = request.cookies.get(CSRF_COOKIE)
        if not (cookie and submitted and self._valid(cookie)
                and secrets.compare_digest(cookie.encode(), submitted.encode())):
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                "missing or wrong CSRF token: reload the page and try again")

    def _valid(self, token: str) -> bool:
        try:
            self._signer.loads(token)
        except BadSignature:
            return False
        return True
