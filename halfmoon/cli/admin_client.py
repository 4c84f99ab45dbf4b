"""A small client of the admin HTTP API, standard library only (the CLI must start fast)."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from halfmoon import environment
from halfmoon.errors import EXIT_FAILED, HalfmoonError

DEFAULT_ADMIN_URL = "http://127.0.0.1:8082"
ADMIN_ENV = environment.ADMIN.name
NAMESPACE_ENV = environment.NAMESPACE.name


def default_admin_url() -> str:
    return environment.ADMIN.get() or DEFAULT_ADMIN_URL


def default_namespace() -> str:
    return environment.NAMESPACE.get() or ""


class CliError(Exception):
    """An error the CLI reports as one line, with an optional stable code, and exits with."""

    def __init__(self, message: str, code: str | None = None, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.exit_code = exit_code

    @classmethod
    def of(cls, error: HalfmoonError) -> CliError:
        """A halfmoon error as the CLI reports it: its message, code and exit code."""
        return cls(error.message, error.code, error.exit_code)

    def line(self) -> str:
        return f"{self.message} ({self.code})" if self.code else self.message


def quote(name: str) -> str:
    """A topic or group name as one path segment (``%DLQ%g`` has percent signs)."""
    return urllib.parse.quote(name, safe="")


class AdminClient:
    def __init__(
        self,
        base_url: str,
        timeout: float = 10.0,
        namespace: str = "",
        credentials: tuple[str, str] | None = None,
        ca_file: str | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise CliError(
                f"bad admin address {base_url!r}: expected http://HOST:PORT", "BAD_REQUEST"
            )
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # Sent with every request: the API takes the names it is given in this namespace.
        self.namespace = namespace
        self._authorization = None
        if credentials is not None:  # HTTP Basic; the secret is never printed
            token = base64.b64encode(":".join(credentials).encode()).decode()
            self._authorization = f"Basic {token}"
        self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else None

    def get(self, path: str, **query: Any) -> Any:
        params = {k: v for k, v in query.items() if v is not None}
        if params:
            path += "?" + urllib.parse.urlencode(params)
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PATCH", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer; raises CliError carrying the API's error code."""
        data = None if body is None else json.dumps(body).encode()
        if self.namespace:
            separator = "&" if "?" in path else "?"
            path += separator + urllib.parse.urlencode({"namespace": self.namespace})
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if self._authorization is not None:
            req.add_header("Authorization", self._authorization)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            raise self._api_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, socket.timeout | TimeoutError):
                reason = f"no answer within {self.timeout:g} s"
            raise CliError(
                f"cannot reach the admin API at {self.base_url}: {reason} "
                f"(is `halfmoon serve` running? set --admin or {ADMIN_ENV})",
                "UNAVAILABLE",
            ) from None
        if not payload:
            return None
        try:
            return json.loads(payload)
        except ValueError:
            raise CliError(
                f"the admin API at {self.base_url} answered {method} {path} "
                "with something not JSON",
                "BAD_RESPONSE",
            ) from None

    def _api_error(self, exc: urllib.error.HTTPError) -> CliError:
        try:
            error = json.loads(exc.read())["error"]
            return CliError(str(error["message"]), str(error["code"]))
        except (ValueError, KeyError, TypeError):
            return CliError(
                f"the admin API at {self.base_url} answered HTTP {exc.code} {exc.reason}",
                f"HTTP_{exc.code}",
            )
