"""CORS for the origins --allowed-origins names (Starlette's middleware), origins compared as the
origin guard compares them, refusals in JSON.

Starlette answers a preflight it refuses (a method other than GET or POST, say) with a plain
text 400 ("Disallowed CORS method"); every other error of this server is an OpenAI error body,
so the refusal is one too, with the same headers. An origin in capitals or with its scheme's
default port passed the guard, then failed Starlette's exact comparison.
"""

import json

from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from tandem.serve.api.errors import error_body
from tandem.serve.api.origin_guard import same_origin_form


class JsonCORSMiddleware(CORSMiddleware):
    def is_allowed_origin(self, origin: str) -> bool:
        return super().is_allowed_origin(same_origin_form(origin))

    def preflight_response(self, request_headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        reason = response.body.decode("utf-8", "replace")  # "Disallowed CORS method, headers"
        headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
        body = error_body(f"{reason}: this server allows GET and POST from its allowed origins",
                          "invalid_request_error", code="cors_preflight_refused")
        return Response(json.dumps(body), response.status_code, headers, media_type="application/json")
