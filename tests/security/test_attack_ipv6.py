"""Route (issue 24, item 5): internal IPv4 hidden in an IPv6 form web_fetch took for public."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from fleet.errors import ToolError
from fleet.tools.base import ToolContext
from fleet.tools.netguard import allowed, is_public, resolve
from fleet.tools.web import web_fetch

HIDDEN = [
    pytest.param("64:ff9b:1::a9fe:a9fe", id="nat64-local-96-metadata"),
    pytest.param("64:ff9b:1:a9fe:a9:fe00::", id="nat64-local-48-metadata"),
    pytest.param("64:ff9b:1:7f:0:100::", id="nat64-local-56-loopback"),
    pytest.param("64:ff9b:1:0:7f:0:1:0", id="nat64-local-64-loopback"),
    pytest.param("64:ff9b::7f00:1", id="nat64-loopback"),
    pytest.param("64:ff9b::a00:1", id="nat64-private"),
    pytest.param("::7f00:1", id="ipv4-compatible-loopback"),
    pytest.param("::a9fe:a9fe", id="ipv4-compatible-metadata"),
    pytest.param("::ffff:0:7f00:1", id="siit-loopback"),
    pytest.param("::ffff:0:a9fe:a9fe", id="siit-metadata"),
    pytest.param("::ffff:169.254.169.254", id="mapped-metadata"),
    pytest.param("2002:7f00:1::1", id="6to4-loopback"),
    pytest.param("2002:a9fe:a9fe::1", id="6to4-metadata"),
    pytest.param("2001:0:4136:e378:8000:63bf:80ff:fffe", id="teredo-client-loopback"),
    pytest.param("fec0::1", id="site-local"),
    pytest.param("fec0:1:2:3::4", id="site-local-subnet"),
]
"""Each spelling refused: its embedded IPv4 is loopback, private or link-local."""

PUBLIC = ["64:ff9b::808:808", "::ffff:8.8.8.8", "2002:808:808::1", "2606:4700:4700::1111"]
"""Public IPv4 behind the same forms stays reachable: the guard decodes, it does not ban."""


@pytest.mark.parametrize("address", HIDDEN)
def test_every_ipv4_in_ipv6_form_of_an_internal_address_is_refused(address: str) -> None:
    """Route: `64:ff9b:1::a9fe:a9fe` (NAT64 to 169.254.169.254), `::7f00:1`, `::ffff:0:7f00:1`
    and `fec0::1` passed as public. Control: the embedded IPv4 is decoded (every place it may
    sit) and checked with the IPv4 rules; site-local is refused outright."""
    assert not is_public(ipaddress.ip_address(address))
    with pytest.raises(ToolError, match="not a public address"):
        resolve(address, 80, ())


@pytest.mark.parametrize("address", HIDDEN[:4] + HIDDEN[6:9] + HIDDEN[14:15])
def test_web_fetch_never_connects_to_a_hidden_internal_address(
    tmp_path: Path, address: str
) -> None:
    """The tool itself, as a model calls it: refused before any connection."""
    with pytest.raises(ToolError, match="web_fetch refuses"):
        web_fetch(ToolContext(workspace=tmp_path), f"http://[{address}]:8600/latest/meta-data/")


@pytest.mark.parametrize("address", PUBLIC)
def test_public_ipv4_behind_an_ipv6_form_stays_public(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


def test_the_operator_allows_the_embedded_network_or_the_ipv6_prefix() -> None:
    """FLEET_WEB_ALLOW rules apply to the IPv4 inside, and to the IPv6 form as written."""
    nat64 = ipaddress.ip_address("64:ff9b::a00:105")
    assert allowed("x", nat64, ("10.0.0.0/8",))
    assert not allowed("x", nat64, ("192.168.0.0/16",))
    local = ipaddress.ip_address("64:ff9b:1::a00:105")
    assert not allowed("x", local, ("10.0.0.0/8",))  # the /48 reading says 0.0.0.0: unknown
    assert allowed("x", local, ("64:ff9b:1::/48",))
