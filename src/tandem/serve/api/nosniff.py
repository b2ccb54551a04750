"""Every response says `X-Content-Type-Options: nosniff`: a browser takes each body as the type
it is sent with (a JSON error or a text/plain body is never run as a script or a page)."""

NOSNIFF = (b"x-content-type-options", b"nosniff")


class NoSniff:
    """ASGI middleware adding the header to each HTTP response's start."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_nosniff(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), NOSNIFF]}
            await send(message)

        await self.app(scope, receive, send_nosniff)
