"""Errors as OpenAI shapes them, so every OpenAI client raises its usual exception class."""
from __future__ import annotations

# HTTP status → OpenAI's error "type" (the SDK picks its exception class by status).
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
    500: "server_error", 502: "upstream_error", 503: "service_unavailable", 504: "timeout_error",
}


class GatewayError(Exception):
    """An answer other than success: status, a message naming what was wrong, and a code."""

    def __init__(self, status: int, message: str, code: str, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return error_body(self.status, self.message, self.code)


def error_body(status: int, message: str, code: str) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"),
                      "param": None, "code": code}}


class StoreUnavailable(GatewayError):
    """The shared store did not answer in time: nothing may pass unmetered, so 503."""

    def __init__(self, store: str, why: str) -> None:
        super().__init__(503, f"the gateway's store {store} is unreachable ({why}); "
                              "requests are refused until it answers again", "store_unavailable",
                         {"Retry-After": "1"})
