"""Logs an operator can run on: the level and format from the environment variables every
ctrlhub SDK reads (``CTRLHUB_LOG``, ``CTRLHUB_LOG_FORMAT``), text or JSON lines in the
manager's shape, every line logged during a reconcile carrying its key and request id (and,
in JSON, its trace and span ids), and tracebacks rate-limited per key."""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ._config import ConfigError

__all__ = [
    "FORMAT_ENV",
    "LEVEL_ENV",
    "TRACE",
    "JsonFormatter",
    "Span",
    "TextFormatter",
    "configure_logging",
    "format_from_env",
    "level_from_env",
]

TRACE = 5
"""A level below DEBUG (``CTRLHUB_LOG=trace``): every message on the stream."""
logging.addLevelName(TRACE, "TRACE")

LEVEL_ENV = "CTRLHUB_LOG"
"""The environment variable holding the log level: ``error``, ``warn``, ``info`` (the
default), ``debug`` or ``trace``."""
FORMAT_ENV = "CTRLHUB_LOG_FORMAT"
"""The environment variable holding the log format: ``text`` (the default) or ``json``."""

_LEVELS = {"error": logging.ERROR, "warn": logging.WARNING, "warning": logging.WARNING, "info": logging.INFO,
           "debug": logging.DEBUG, "trace": TRACE}
_NAMES = {TRACE: "TRACE", logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARN",
          logging.ERROR: "ERROR", logging.CRITICAL: "ERROR"}


def level_from_env(env: Mapping[str, str] | None = None, default: int | str = logging.INFO) -> int:
    """The level ``CTRLHUB_LOG`` names (``default`` when it is unset or empty)."""
    text = (os.environ if env is None else env).get(LEVEL_ENV, "").strip()
    return parse_level(text, LEVEL_ENV) if text else parse_level(default, "log_level")


def parse_level(value: int | str, what: str = "log level") -> int:
    """A logging level from a number or a name (``warn``, ``INFO``, ``trace``, ...)."""
    if isinstance(value, int):
        return value
    level = _LEVELS.get(value.strip().lower())
    if level is None:
        raise ConfigError(f"{what}={value!r}: the log level is one of error, warn, info, debug, trace")
    return level


def format_from_env(env: Mapping[str, str] | None = None, default: str = "text") -> str:
    """The format ``CTRLHUB_LOG_FORMAT`` names (``default`` when it is unset or empty)."""
    text = (os.environ if env is None else env).get(FORMAT_ENV, "").strip().lower() or default
    if text not in ("text", "json"):
        raise ConfigError(f"{FORMAT_ENV}={text!r}: the log format is text or json")
    return text


@dataclass
class Span:
    """The reconcile (or event) a log line was written in: its fields go on every line."""

    controller: str
    key: str
    request_id: str
    attempt: int
    session_id: str
    traceparent: Any = None
    """An object with ``span_traceparent`` (the request): read when a line is formatted, so
    the ids are those of the handler's own span once it is open."""
    name: str = "reconcile"

    def fields(self) -> dict[str, Any]:
        """The span's fields, as the manager's JSON lines carry them."""
        out: dict[str, Any] = {"name": self.name, "controller": self.controller, "key": self.key,
                               "request_id": self.request_id, "attempt": self.attempt, "session_id": self.session_id}
        parts = str(getattr(self.traceparent, "span_traceparent", "") or "").split("-")
        if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
            out["trace_id"], out["span_id"] = parts[1], parts[2]
        return out


current: contextvars.ContextVar[Span | None] = contextvars.ContextVar("ctrlhub_span", default=None)
"""The reconcile running in this task or thread (the SDK sets it around each handler)."""


def _span_of(record: logging.LogRecord) -> Span | None:
    span = getattr(record, "ctrlhub_span", None)
    return span if isinstance(span, Span) else current.get()


class _Formatter(logging.Formatter):
    @staticmethod
    def timestamp(record: logging.LogRecord) -> str:
        return datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    @staticmethod
    def level(record: logging.LogRecord) -> str:
        return _NAMES.get(record.levelno, record.levelname)


class TextFormatter(_Formatter):
    """``2026-11-26T10:00:00.123456Z INFO ctrlhub.website: message key=ns/name request_id=...``:
    the reconcile's key and request id are appended to every line logged during it (unless
    the message already names them)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        span = _span_of(record)
        if span is not None:
            named = getattr(record, "ctrlhub_fields", None) or {}
            extra = [f"{k}={v}" for k, v in (("key", span.key), ("request_id", span.request_id)) if k not in named]
            if extra:
                message = f"{message} {' '.join(extra)}"
        line = f"{self.timestamp(record)} {self.level(record)} {record.name}: {message}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info).rstrip("\n")
        return line


class JsonFormatter(_Formatter):
    """One JSON object per line, in the manager's ``--log-format json`` shape: ``timestamp``,
    ``level``, ``target`` (the logger), ``fields`` (``message`` and the line's fields, a
    traceback as ``exception``) and, inside a reconcile, ``span`` (``name``, ``controller``,
    ``key``, ``request_id``, ``attempt``, ``session_id``, ``trace_id``, ``span_id``)."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {"message": record.getMessage()}
        fields.update(getattr(record, "ctrlhub_fields", None) or {})
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        line: dict[str, Any] = {"timestamp": self.timestamp(record), "level": self.level(record), "fields": fields,
                                "target": record.name}
        span = _span_of(record)
        if span is not None:
            line["span"] = span.fields()
        return json.dumps(line, default=str)


class ContextFilter(logging.Filter):
    """Attaches the running reconcile (``Span``) to a record logged in its task or thread."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "ctrlhub_span", None) is None:
            record.ctrlhub_span = current.get()
        return True


def configure_logging(level: int | str | None = None, format: str | None = None, stream: Any = None) -> bool:
    """Log to stderr at ``level`` in ``format`` (``text`` or ``json``); None: from
    ``CTRLHUB_LOG`` and ``CTRLHUB_LOG_FORMAT``, else ``info`` and ``text``. Leaves logging
    alone, and returns False, when the root logger already has handlers (the program configured
    logging itself)."""
    root = logging.getLogger()
    chosen = level_from_env() if level is None else parse_level(level)
    fmt = format_from_env() if format is None else format_from_env({FORMAT_ENV: format})
    if root.handlers:
        return False
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    root.addHandler(handler)
    root.setLevel(chosen)
    return True


class HandlerLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The ``logger`` a handler receives: its controller's logger, every line carrying the
    reconcile's key and request id (whatever formatter the program uses, as the record's
    ``ctrlhub_span``)."""

    def __init__(self, logger: logging.Logger, span: Span) -> None:
        super().__init__(logger, {})
        self.span = span

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = dict(kwargs.get("extra") or {})
        extra.setdefault("ctrlhub_span", self.span)
        kwargs["extra"] = extra
        return msg, kwargs


class TracebackBudget:
    """At most one traceback per key per ``period`` seconds; the rest are logged as one line."""

    def __init__(self, period: float = 60.0) -> None:
        self.period = period
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def allow(self, key: str, now: float | None = None) -> bool:
        """Whether a traceback for ``key`` may be logged now (and, if so, records it)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.period:
                return False
            if len(self._last) > 4096:
                self._last = {k: t for k, t in self._last.items() if now - t < self.period}
            self._last[key] = now
            return True


def describe(err: BaseException) -> str:
    """``Type: message`` of an exception, on one line."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def one_line_traceback(err: BaseException) -> str:
    """Where an exception was raised, as ``file:line in function`` (for a line without the
    traceback)."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno} in {last.name}"
