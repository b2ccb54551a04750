"""Bearer-key authentication for /v1/*: with --api-key set, a request must carry
`Authorization: Bearer <key>`. /health, /metrics and the dashboard stay open (as vLLM does)."""

import hmac

from fastapi import Request

from tandem.serve.api.errors import APIError


def require_api_key(api_key: str | None):
    """A FastAPI dependency that refuses (401) a request without the right key; a no-op without one."""

    async def check(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise _unauthorized("missing API key: send 'Authorization: Bearer <key>'", "missing_api_key")
        if not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise _unauthorized("incorrect API key provided", "invalid_api_key")

    return check


def _unauthorized(message: str, code: str) -> APIError:
    return APIError(401, message, "authentication_error", code=code, headers={"WWW-Authenticate": "Bearer"})
