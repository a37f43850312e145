"""Secrets out of every text that leaves a worker: errors, logs, traces, Flower, the terminal.

Two layers, because either alone misses something:

- **Known values.** Every value of a secret-named environment variable (`*_KEY`, `*TOKEN*`,
  `*PASS*`, `*PWD*`, `*_DSN`, `*WEBHOOK*`, `*CONNECTION_STRING*`, `*_PAT`, ...), the password
  of every URL-valued variable (`redis://:pw@host`) and any key a client was given are
  replaced wherever they appear, whatever quoting or punctuation surrounds them.
- **Shapes.** `Authorization: Bearer ...`, `x-api-key: ...`, the userinfo of a URL and the
  well-known key prefixes (`sk-`, `ghp_`, `xoxb-`, `AKIA`, ...) are masked even when the
  value is not one we know, e.g. a provider echoing a header it was sent.

`Redactor.from_env(env)` is built once per process (the runtime holds one); `redact(text)`
with no redactor applies the shapes only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

REDACTED = "[redacted]"

MIN_SECRET_CHARS = 6
"""Shorter values are not replaced: `PASS=1` would blank every digit 1 of every text."""

SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASS|PWD|CREDENTIAL|AUTH|DSN|WEBHOOK|CONNECTION_STRING|COOKIE"
    r"|SESSION|PRIVATE|SIGNATURE|(?:^|_)PAT(?:_|$)|(?:^|_)SAS(?:_|$)",
    re.IGNORECASE,
)
"""Environment variable names whose values are treated as secrets."""

NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD"})
"""The shell's working directories: `*PWD*` names a password elsewhere (`DB_PWD`), but
masking these would blank the current directory out of every path in every message."""

_KEY_PREFIX = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"(?:sk|pk|rk)-[A-Za-z0-9_\-]{6,}|sk_[A-Za-z0-9_\-]{6,}|gh[pousr]_[A-Za-z0-9_]{6,}"
    r"|github_pat_[A-Za-z0-9_]{6,}|xox[abprs]-[A-Za-z0-9\-]{6,}|hf_[A-Za-z0-9]{6,}"
    r"|glpat-[A-Za-z0-9_\-]{6,}|AKIA[0-9A-Z]{12,}|AIza[0-9A-Za-z_\-]{20,}"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{4,}"
    r")"
)
"""Provider key formats: OpenAI/Anthropic/Stripe, GitHub, Slack, Hugging Face, GitLab,
AWS access key ids, Google API keys, JWTs."""

_HEADER = re.compile(
    r"(?P<name>\b(?:proxy-)?authorization|\bx-api-key|\bapi-key|\bx-auth-token|\bcookie)"
    r"(?P<sep>[\"']?\s*[:=]\s*[\"']?)"
    r"(?:(?P<scheme>bearer|basic|token|digest)\s+)?"
    r"[^\s\"',;}&]+",
    re.IGNORECASE,
)
"""`Authorization: Bearer X`, `"x-api-key": "X"`, `authorization=X`: the value goes."""

_SCHEME_TOKEN = re.compile(r"\b(?P<scheme>bearer|basic)\s+[A-Za-z0-9._~+/=\-]{8,}", re.IGNORECASE)
"""A bare `Bearer X` with no header name in front (an echoed request line)."""

_URL_USERINFO = re.compile(r"(?P<head>\b[a-z][a-z0-9+.\-]*://[^\s/@:\"']*:)[^\s/@\"']+@", re.I)
"""`scheme://user:password@host`: the password goes, the user and host stay."""

_PASSWORD_PARAM = re.compile(
    r"(?P<head>[?&;](?:password|passwd|pwd|token|key|secret|sig|signature|api_key|apikey|"
    r"access_token|auth)=)[^&\s\"'#]+",
    re.IGNORECASE,
)
"""`?password=X`, `&api_key=X`, `&sig=X` in a URL or connection string."""


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name marks its value as a secret."""
    return name.upper() not in NOT_SECRET_NAMES and bool(SECRET_NAME.search(name))


def secret_values(env: Mapping[str, str]) -> set[str]:
    """Every secret the environment holds: secret-named values and URL passwords.

    A value is taken whole and, when it is a URL or a `k=v;k=v` connection string, its
    password/key parts too, so a secret quoted on its own is found as well.
    """
    found: set[str] = set()
    for name, value in env.items():
        value = value.strip()
        if not value:
            continue
        secret = is_secret_name(name)
        if secret:
            found.add(value)
        found.update(_embedded_secrets(value, with_user=secret))
    return {v for v in found if len(v) >= MIN_SECRET_CHARS}


def _embedded_secrets(value: str, *, with_user: bool) -> set[str]:
    """Passwords inside URLs and connection strings (`AccountKey=...;`).

    `with_user`: the URL's user name too — in a secret-named variable (`SENTRY_DSN`) the
    user part *is* the key.
    """
    found: set[str] = set()
    for word in re.split(r"[\s,;]+", value):
        if "://" in word:
            try:
                parts = urlsplit(word)
                userinfo = [parts.password, parts.username if with_user else None]
            except ValueError:
                userinfo = []
            for part in filter(None, userinfo):
                found.update({part, unquote(part)})
    for match in re.finditer(r"(?:key|password|pwd|secret|token|sig)=([^;&\s]+)", value, re.I):
        found.add(match.group(1))
    return found


@dataclass(frozen=True)
class Redactor:
    """Masks a fixed set of known secret values plus every secret shape in a text."""

    values: tuple[str, ...] = ()
    """Longest first, so a value containing another is replaced whole."""
    _pattern: re.Pattern[str] | None = None

    @classmethod
    def of(cls, values: Iterable[str]) -> Redactor:
        """A redactor for these values (short ones are ignored, see MIN_SECRET_CHARS)."""
        kept: set[str] = set()
        for value in values:
            if len(value) >= MIN_SECRET_CHARS:
                kept.update({value, quote(value, safe="")})
        ordered = tuple(sorted(kept, key=lambda v: (-len(v), v)))
        pattern = re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None
        return cls(ordered, pattern)

    @classmethod
    def from_env(cls, env: Mapping[str, str], extra: Iterable[str] = ()) -> Redactor:
        """A redactor for every secret of `env`, plus `extra` values."""
        return cls.of([*secret_values(env), *extra])

    def with_values(self, values: Iterable[str]) -> Redactor:
        """A redactor knowing these values too."""
        return Redactor.of([*self.values, *values])

    def __call__(self, text: str) -> str:
        """`text` with every known value and secret shape replaced by `[redacted]`."""
        return redact_shapes(self.values_only(text))

    def values_only(self, text: str) -> str:
        """`text` with the known values replaced, nothing else touched.

        For what an agent reads and writes (tool outputs, model text): workspace content
        that merely looks like a credential stays as it is; the worker's own secrets go.
        """
        # Substring tests first: one C-level scan per value is ~10x cheaper than the
        # alternation, and almost every text holds none of them.
        if self._pattern is None or not text or not any(v in text for v in self.values):
            return text
        return self._pattern.sub(REDACTED, text)

    def values_in(self, value: Any) -> Any:
        """A JSON-like value (a structured answer, a context) with known values masked."""
        if isinstance(value, str):
            return self.values_only(value)
        if isinstance(value, dict):
            return {self.values_only(str(k)): self.values_in(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.values_in(item) for item in value]
        return value

    def contains_secret(self, text: str) -> bool:
        """Whether redaction would change `text`."""
        return self(text) != text


_SHAPE_MARKS = (
    "password=",
    "passwd=",
    "pwd=",
    "token=",
    "key=",
    "secret=",
    "sig=",
    "signature=",
    "auth=",
    "://",
    "k-",
    "k_",
    "gh",
    "github_pat_",
    "xox",
    "hf_",
    "glpat-",
    "akia",
    "aiza",
    "eyj",
    "authorization",
    "api-key",
    "x-auth-token",
    "cookie",
    "bearer",
    "basic",
)
"""A text no shape above can match contains none of these, lower-cased: every match holds
a parameter (`key=` also in `api_key=`, `token=` in `access_token=`), `://` (a URL), a
header name, a scheme, or a key prefix (`sk-` and `sk_` hold `k-`/`k_`, `ghp_` holds
`gh`). Keep in step with the shapes (tests/test_redact.py fails for a missing mark)."""

_FOLD_TO_ASCII = str.maketrans({"İ": "i", "ı": "i", "ſ": "s", "K": "k"})
"""The only non-ASCII letters the patterns' IGNORECASE matches to ASCII ones (`ſ` matches
`s`; a test scans every code point): mapped to them before lower-casing, so a non-ASCII
text (`…` in a capped name, a curly quote) is checked for the marks too. Lower-casing
alone would miss `ſ` and `ı`, and turn `İ` into two characters."""


def redact_shapes(text: str) -> str:
    """Mask what looks like a credential: auth headers, URL passwords, key formats."""
    if not text:
        return text
    # One C-level substring scan per mark is ~5x cheaper than the five patterns, and the
    # ids, names and short texts that make up most of what is redacted hold none of them.
    folded = (text if text.isascii() else text.translate(_FOLD_TO_ASCII)).lower()
    if not any(mark in folded for mark in _SHAPE_MARKS):
        return text
    return _redact_each_shape(text)


def _redact_each_shape(text: str) -> str:
    text = _HEADER.sub(_header_repl, text)
    text = _SCHEME_TOKEN.sub(_scheme_repl, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('head')}{REDACTED}@", text)
    text = _PASSWORD_PARAM.sub(lambda m: f"{m.group('head')}{REDACTED}", text)
    return _KEY_PREFIX.sub(REDACTED, text)


def _scheme_repl(match: re.Match[str]) -> str:
    # "Basic information" is prose; a token has a digit in it.
    if not any(c.isdigit() for c in match.group(0)):
        return match.group(0)
    return f"{match.group('scheme')} {REDACTED}"


def _header_repl(match: re.Match[str]) -> str:
    scheme = f"{match.group('scheme')} " if match.group("scheme") else ""
    return f"{match.group('name')}{match.group('sep')}{scheme}{REDACTED}"


SHAPES_ONLY = Redactor()
"""Masks secret shapes only; for code that has no environment to learn values from."""


_installed: list[Redactor] = []
"""The redactor the log record factory uses; a list so a second install only updates it."""


def install_log_redaction(redactor: Redactor) -> None:
    """Redact every log record this process creates, its traceback included.

    A record factory rather than a handler filter: it sees every record, whichever
    handler (Celery's, a test's, a library's) ends up writing it, and handlers added
    later. Records are made only after the level check, so skipped debug lines cost
    nothing. Installing again replaces the redactor, it does not wrap twice.
    """
    if _installed:
        _installed[0] = redactor
        return
    _installed.append(redactor)
    make_record = logging.getLogRecordFactory()

    def redacting_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        _redact_record(record, _installed[0])
        return record

    logging.setLogRecordFactory(redacting_record)


def _redact_record(record: logging.LogRecord, redactor: Redactor) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a malformed %-format: leave it to the handler to report
        return
    record.msg, record.args = redactor(message), None
    if record.exc_info and record.exc_info[1] is not None:
        record.exc_text = redactor(_formatter.formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = redactor(record.stack_info)


_formatter = logging.Formatter()
