"""The one request context every API dialect builds: who calls, how much they may, until when.

``RequestContext.build`` authenticates the caller (whatever the dialect's way of sending a key,
it arrives here as one ``Authorization``-style string), counts the request against its rate,
turns ``X-Request-Timeout`` into a deadline (the server's own, lowered by the client; below the
documented minimum it is invalid input, not a 504 later) and fetches the ready translator. The
native, LibreTranslate and DeepL routes all use it, and so must any route added later.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from starlette.requests import Request

from service.contract.errors import InvalidInput
from service.frontend.access import AccessControl, Client
from service.frontend.runtime import Runtime
from service.frontend.translation.translator import Translator

TIMEOUT_HEADER = "x-request-timeout"


@dataclass(frozen=True, slots=True)
class RequestContext:
    client: Client
    # A ``time.monotonic()`` instant.
    deadline: float
    translator: Translator
    access: AccessControl

    @classmethod
    async def build(cls, request: Request, authorization: str | None) -> RequestContext:
        """The context of ``request``; raises the typed error that refuses it."""
        runtime: Runtime = request.app.state.runtime
        access: AccessControl = request.app.state.access
        deadline = deadline_of(request, runtime)
        address = request.client.host if request.client else "unknown"
        client = access.authenticate(authorization, address)
        await access.admit(client)
        return cls(client=client, deadline=deadline, translator=runtime.translator, access=access)

    @property
    def caller(self) -> str:
        """The client itself (its key's identity, or its address on an open service): who
        may change the glossaries it created."""
        return self.client.identity

    @property
    def owner(self) -> str:
        """Whose glossaries (and other stored resources) this caller sees: its key's, or the
        one shared owner of an open service."""
        return self.client.identity if self.client.identity.startswith("key:") else "open"

    async def charge(self, characters: int) -> None:
        """Count ``characters`` against the caller's quota (``QuotaExceeded`` when spent)."""
        await self.access.charge(self.client, characters)


def deadline_of(request: Request, runtime: Runtime) -> float:
    """The request's deadline: the server's timeout, lowered by ``X-Request-Timeout``."""
    policy = runtime.policy
    seconds = policy.request_timeout_s
    given = request.headers.get(TIMEOUT_HEADER)
    if given is not None:
        try:
            asked = float(given)
        except ValueError:
            raise InvalidInput("X-Request-Timeout: not a number of seconds") from None
        if not math.isfinite(asked):
            raise InvalidInput("X-Request-Timeout: not a finite number of seconds")
        if asked < policy.min_request_timeout_s:
            raise InvalidInput(
                f"X-Request-Timeout: at least {policy.min_request_timeout_s} seconds"
            )
        seconds = min(seconds, asked)
    return time.monotonic() + seconds
