"""fleet.security.redact: known secret values and credential shapes masked, ordinary text kept."""

from __future__ import annotations

import logging
import random
import re
import sys

import pytest

from fleet.security.redact import (
    _FOLD_TO_ASCII,
    REDACTED,
    Redactor,
    _redact_each_shape,
    install_log_redaction,
    is_secret_name,
    redact_shapes,
    secret_values,
)

ENV = {
    "OPENAI_API_KEY": "sk-proj-0123456789abcdef",
    "GH_PAT": "plainlookingvalue42",
    "REDIS_PASS": "hunter2hunter2",
    "DB_PWD": "correct horse",
    "SENTRY_DSN": "https://abc123def456@sentry.example/1",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.example/T0/B0/XyZ",
    "AZURE_STORAGE_CONNECTION_STRING": "Protocol=https;AccountKey=QmFzZTY0S2V5PT0=;",
    "FLEET_REDIS_URL": "redis://:s3cretpassw0rd@redis:6379/0",
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/fleet",
    "SHORT_TOKEN": "abc",
    "PWD": "/srv/fleet/workspace",
}


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("GH_PAT", True),
        ("REDIS_PASS", True),
        ("DB_PWD", True),
        ("SENTRY_DSN", True),
        ("SLACK_WEBHOOK_URL", True),
        ("AZURE_STORAGE_CONNECTION_STRING", True),
        ("PATH", False),
        ("HOME", False),
        ("FLEET_WORKSPACE", False),
        ("PWD", False),
        ("OLDPWD", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_secret_values_take_named_values_url_passwords_and_connection_keys() -> None:
    values = secret_values(ENV)
    for name in ("OPENAI_API_KEY", "GH_PAT", "REDIS_PASS", "DB_PWD", "SLACK_WEBHOOK_URL"):
        assert ENV[name] in values
    assert {"s3cretpassw0rd", "abc123def456", "QmFzZTY0S2V5PT0="} <= values
    assert "/usr/bin:/bin" not in values and "abc" not in values, "short or not secret"
    assert "/srv/fleet/workspace" not in values, "the shell's working directory is no password"


@pytest.mark.parametrize(
    "wrapped",
    [
        '"{v}"',
        "'{v}'",
        "({v})",
        "[{v}]",
        "`{v}`",
        "key={v};",
        '{{"token": "{v}"}}',
        "x{v}y",
    ],
)
def test_known_values_go_whatever_surrounds_them(wrapped: str) -> None:
    redactor = Redactor.from_env(ENV)
    for name in ("GH_PAT", "REDIS_PASS", "DB_PWD"):
        text = wrapped.format(v=ENV[name])
        assert ENV[name] not in redactor(text)
        assert REDACTED in redactor(text)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("Authorization: Bearer abc.def-123456789", "Authorization: Bearer [redacted]"),
        ('{"authorization": "Bearer zzz999yyy888"}', '{"authorization": "Bearer [redacted]"}'),
        ("x-api-key: sk-ant-api03-abcdef123", "x-api-key: [redacted]"),
        ("headers were {'x-api-key': 'k9k9k9k9k9'}", "headers were {'x-api-key': '[redacted]'}"),
        ("GET /v1 Bearer eyJhbGciOi.eyJzdWIiOiIx.c2lnbmF0dXJl1", "GET /v1 Bearer [redacted]"),
        ("redis://user:pa55word@host:6379/0", "redis://user:[redacted]@host:6379/0"),
        ("https://h/x?sig=abcdef&y=1", "https://h/x?sig=[redacted]&y=1"),
        ("use ghp_abcdefghijklmnopqrstu now", "use [redacted] now"),
        ('key "AKIAABCDEFGHIJKLMNOP"', 'key "[redacted]"'),
    ],
)
def test_credential_shapes_are_masked(text: str, kept: str) -> None:
    assert redact_shapes(text) == kept


@pytest.mark.parametrize(
    "text",
    [
        "Basic information about the repo",
        "the skeleton key is fine",
        "def authorization_check(user): ...",
        "sk-learn is a library",
        "https://example.com/docs?page=2",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert Redactor.from_env(ENV)(text) == text


def test_values_only_leaves_shapes_of_workspace_content() -> None:
    redactor = Redactor.from_env(ENV)
    text = f"config: Authorization: Bearer notours123456 and {ENV['GH_PAT']}"
    assert (
        redactor.values_only(text) == "config: Authorization: Bearer notours123456 and [redacted]"
    )


def test_log_records_and_tracebacks_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    secret = ENV["REDIS_PASS"]
    install_log_redaction(Redactor.from_env(ENV))
    try:
        log = logging.getLogger("fleet.test.redact")
        with caplog.at_level(logging.INFO):
            log.info("connecting with %s", secret)
            try:
                raise RuntimeError(f"auth failed for {secret}")
            except RuntimeError:
                log.exception("boom")
        text = caplog.text
        assert secret not in text and REDACTED in text
        assert "RuntimeError: auth failed for [redacted]" in text
    finally:
        install_log_redaction(Redactor())


def test_values_in_a_json_value_are_masked_keys_included() -> None:
    secret = ENV["GH_PAT"]
    value = {"token": secret, "list": [1, f"x{secret}", {secret: True}], "n": None}
    masked = Redactor.from_env(ENV).values_in(value)
    assert secret not in repr(masked)
    assert masked["list"][0] == 1 and masked["n"] is None and masked["token"] == REDACTED


SHAPE_FRAGMENTS = [
    "Authorization: ",
    "PROXY-AUTHORIZATION=",
    "x-api-key",
    "Api-Key: ",
    "X-Auth-Token:",
    "Cookie=",
    "cookie: ",
    "eyJhbGciOi.eyJzdWIiOiIx.c2ln",
    "sk_live0abcdef",
    "redis://u:pw0abc@h",
    "xoxb-abcdefgh",
    "AKIAQWERTYUIOPZXCVBN",
    "AIzaQWERTYUIOPZXCVBNMQWERTY",
    "github_pat_abcdefgh",
    "Bearer ",
    "BASIC ",
    "basic ",
    "token ",
    "https://",
    "redis://u:",
    "@host",
    "?password=",
    "?passwd=",
    ";pwd=",
    "?token=",
    "&access_token=",
    "&secret=",
    "&signature=",
    "?auth=",
    "&apikey=",
    "mode=explore",
    "&Sig=",
    ";key=",
    "sk-",
    "PK-",
    "rk-",
    "sk_",
    "ghp_",
    "GHO_",
    "github_pat_",
    "xoxb-",
    "hf_",
    "glpat-",
    "AKIA",
    "AIza",
    "eyJ",
    ".",
    "'",
    '"',
    " ",
    ":",
    "=",
    "-",
    "_",
    "abcdefgh",
    "ABCDEFGHIJKLMNOPQRSTUV",
    "12345678",
    "z9",
    "Baſic ",
    "K",
    "é",
    "…",
    "“",
    "authorİzation: ",
    "İ",
    "ı",
    "Aİza",
    "ſig=",
    "coOKİE=",
]


def test_the_shape_pre_check_never_skips_a_text_a_shape_matches() -> None:
    rng = random.Random(14)
    texts = [
        "".join(rng.choice(SHAPE_FRAGMENTS) for _ in range(rng.randint(1, 8)))
        for _ in range(20_000)
    ]
    changed = 0
    for text in texts:
        full = _redact_each_shape(text)
        assert redact_shapes(text) == full, text
        changed += full != text
    assert changed > 2_000, "the corpus exercises the shapes"
    assert redact_shapes("Baſic abcdefgh12345") == _redact_each_shape("Baſic abcdefgh12345")
    assert (
        redact_shapes("authorİzation: x1")
        == _redact_each_shape("authorİzation: x1")
        != ("authorİzation: x1")
    )


def test_the_pre_check_folds_every_letter_ignorecase_matches_to_ascii() -> None:
    """Every non-ASCII character a pattern's IGNORECASE takes for an ASCII letter."""
    letter = re.compile("[a-z]", re.IGNORECASE)
    for code in range(128, sys.maxunicode + 1):
        char = chr(code)
        if letter.match(char):
            folded = char.translate(_FOLD_TO_ASCII).lower()
            assert len(folded) == 1 and folded.isascii(), hex(code)
