"""What an approver is shown of a call (`fleet.conversation.shown_call`), and its digest."""

from __future__ import annotations

import json

from fleet.conversation.shown_call import OTHER_VALUE_CHARS, call_digest, show_call


def lines(name: str, arguments: dict[str, object]) -> list[str]:
    return show_call(name, json.dumps(arguments)).splitlines()


def test_acted_on_arguments_come_first_in_full_and_a_cut_says_how_much() -> None:
    path = "deep/" * 500 + "target.py"  # longer than any cut: still shown whole
    shown = lines("write_file", {"content": "x" * 5000, "path": path})
    assert shown[0] == "write_file"
    assert shown[1] == f"  path: {json.dumps(path)}"
    assert shown[2].endswith(f" … {5002 - OTHER_VALUE_CHARS:,} more characters")


def test_short_arguments_of_an_unknown_tool_are_shown_before_long_ones() -> None:
    shown = lines("mcp__x__put", {"note": "n" * 3000, "where": "/etc/cron.d/x"})
    assert shown[1] == '  where: "/etc/cron.d/x"' and "more characters" in shown[2]


def test_nothing_in_a_call_reaches_the_terminal_as_a_control_character() -> None:
    hostile = {"path": "a\x1b[2J\x9b31m\u202eb\u2028c", "cmd\n": "ok"}
    text = show_call("bash\x1b]0;t\x07", json.dumps(hostile))
    assert not any(ord(c) < 32 and c != "\n" for c in text), text
    assert "\x9b" not in text and "\u202e" not in text and "\u2028" not in text
    assert "\\u001b[2J" in text and "\\u202e" in text and len(text.splitlines()) == 3


def test_arguments_that_are_not_an_object_are_shown_cut_and_escaped() -> None:
    text = show_call("bash", "not json \x1b[2J" + "y" * 3000)
    assert "\x1b" not in text and "more characters" in text


def test_the_digest_binds_the_trace_the_call_and_every_byte_of_its_arguments() -> None:
    one = call_digest("t1", "c1", "write_file", '{"path": "a"}')
    assert one == call_digest("t1", "c1", "write_file", '{"path": "a"}')
    others = {
        call_digest("t2", "c1", "write_file", '{"path": "a"}'),
        call_digest("t1", "c2", "write_file", '{"path": "a"}'),
        call_digest("t1", "c1", "edit_file", '{"path": "a"}'),
        call_digest("t1", "c1", "write_file", '{"path": "a "}'),
    }
    assert one not in others and len(others) == 4
