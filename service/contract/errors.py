"""The domain's errors.

Every failure the service can report is one of these types. Each carries a stable machine-readable
``code`` and a message that is safe to show a client; none knows about HTTP. The API layer maps
types to status codes in one table (``service.frontend.api.errors``).
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error the service reports to a client."""

    code = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ServiceError):
    """The request is well-formed JSON but asks for something the service cannot do."""

    code = "invalid_input"


class UnknownLanguage(InvalidInput):
    code = "unknown_language"


class TextTooLong(InvalidInput):
    code = "text_too_long"


class TooManyTokens(TextTooLong):
    """A text of more tokens than one may have: ``/translate`` cuts it into segments instead
    (a dense script's text, within the characters a text may have). Clients see its code."""


class BatchTooLarge(InvalidInput):
    code = "batch_too_large"


class NotFound(ServiceError):
    """No such route (or resource)."""

    code = "not_found"


class MethodNotAllowed(ServiceError):
    code = "method_not_allowed"


class PayloadTooLarge(ServiceError):
    code = "payload_too_large"


class Overloaded(ServiceError):
    """The queue is full; the client should retry after ``retry_after_s`` seconds."""

    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RateLimited(Overloaded):
    """This client used its request rate or character quota for the current window."""

    code = "rate_limited"


class QuotaExceeded(RateLimited):
    """This client used its character quota for the current window."""

    code = "quota_exceeded"


class TooManyDocuments(RateLimited):
    """This client holds as many document jobs as it may."""

    code = "too_many_documents"


class UnsupportedEncoding(ServiceError):
    """The body comes with a ``Content-Encoding`` (gzip, ...): the service reads bodies as
    they are, and would otherwise call a compressed body "not UTF-8"."""

    code = "unsupported_encoding"


class StorageFull(ServiceError):
    """The service's disk (or its volume's quota) is full: nothing it should keep can be
    written now (an upload, a glossary). The operator's problem, not the client's request's."""

    code = "storage_full"


class Unsupported(InvalidInput):
    """The request asks for an option this service cannot honour."""

    code = "unsupported"


class DeadlineExceeded(ServiceError):
    """The request's deadline passed before its translation was ready."""

    code = "deadline_exceeded"


class Unauthenticated(ServiceError):
    """No API key was given where keys are required."""

    code = "unauthenticated"


class Forbidden(ServiceError):
    """The API key given is not one of the accepted keys."""

    code = "forbidden"


class LimitReached(ServiceError):
    """Storing this would take the caller past what a key may keep (glossaries, their size)."""

    code = "limit_reached"


class NotReady(ServiceError):
    """The model is still loading or warming up."""

    code = "not_ready"


class EngineUnavailable(ServiceError):
    """The worker is dead, failed to load, or the service is shutting down."""

    code = "engine_unavailable"


class EngineStalled(EngineUnavailable):
    """The worker has been inside one batch for longer than the stall timeout."""

    code = "engine_stalled"


class GenerationFailed(ServiceError):
    """The model raised while generating this item."""

    code = "generation_failed"


class OutOfMemory(GenerationFailed):
    """The accelerator ran out of memory while generating this item."""

    code = "out_of_memory"


class EngineDied(EngineUnavailable):
    """The engine process exited or stopped answering while this was in it."""

    code = "engine_unavailable"


def _leaves(kind: type[ServiceError]) -> list[type[ServiceError]]:
    found = [kind]
    for sub in kind.__subclasses__():
        found += _leaves(sub)
    return found


def error_of(code: str, message: str, name: str | None = None) -> ServiceError:
    """The domain error a code names (as an engine process reports it across the boundary);
    ``name``, the class's, where a code is shared (``TooManyTokens`` is a ``TextTooLong``)."""
    for kind in _leaves(ServiceError):
        plain = kind.__init__ is ServiceError.__init__
        if kind.code == code and plain and name in (None, kind.__name__):
            return kind(message)
    if name is not None:
        return error_of(code, message)
    return GenerationFailed(message)
