"""Which addresses web_fetch may reach: a table of spellings and ranges."""

from __future__ import annotations

import ipaddress

import pytest

from fleet.errors import ToolError
from fleet.tools.netguard import allowed, is_public, resolve


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.0.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:8.8.8.8", True),
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
    ],
)
def test_is_public(address: str, public: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is public


def test_the_operator_allows_hosts_addresses_and_networks() -> None:
    inside = ipaddress.ip_address("10.0.5.7")
    assert not allowed("wiki.internal", inside, ())
    assert allowed("wiki.internal", inside, ("wiki.internal",))
    assert allowed("x", inside, ("10.0.0.0/16",))
    assert allowed("x", ipaddress.ip_address("::ffff:10.0.5.7"), ("10.0.5.7",))
    assert not allowed("x", inside, ("10.1.0.0/16", "other.host"))


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "localhost"])
def test_every_spelling_of_loopback_resolves_to_loopback_and_is_refused(host: str) -> None:
    with pytest.raises(ToolError, match="not a public address"):
        resolve(host, 80, ())
