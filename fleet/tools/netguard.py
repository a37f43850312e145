"""Which addresses `web_fetch` may connect to: the public internet, plus what the operator allows.

A model can be steered into fetching `http://169.254.169.254/` (cloud metadata), Redis,
Flower or any service on the worker's network. Every hop is therefore resolved **once**
here and the connection goes to the address that was checked, never to a second lookup
(DNS rebinding). Names are resolved with the system resolver, so every spelling of an
address it accepts — `2130706433`, `0x7f.1`, `017700000001`, `[::ffff:127.0.0.1]` — is
checked as the address it really is.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from fleet.errors import ToolError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_Net = ipaddress.IPv6Network
_IPV4_COMPATIBLE = _Net("::/96")
"""Deprecated IPv4-compatible addresses (`::7f00:1`); `::` and `::1` are not among them."""
_SIIT = _Net("::ffff:0:0:0/96")
"""IPv4-translated addresses of SIIT (RFC 7915): `::ffff:0:7f00:1` is 127.0.0.1."""
_NAT64 = _Net("64:ff9b::/96")
"""The well-known NAT64 prefix (RFC 6052): the IPv4 address is the last 32 bits."""
_NAT64_LOCAL = _Net("64:ff9b:1::/48")
"""The local-use NAT64 prefix (RFC 8215): the operator picks a prefix length from 48 to 96,
so where the IPv4 address sits cannot be known; every possible place is checked."""
_NAT64_LOCAL_LENGTHS = (48, 56, 64, 96)
_SITE_LOCAL = _Net("fec0::/10")
"""Deprecated site-local unicast (RFC 3879): still routed inside some networks."""


@dataclass(frozen=True)
class Target:
    """A checked hop: connect to `address`, but speak HTTP/TLS to `host`."""

    host: str
    port: int
    address: str


def embedded_ipv4s(address: IPAddress) -> tuple[IPAddress, ...]:
    """Every IPv4 address an IPv6 address may carry to the network, else the address itself.

    Covers IPv4-mapped (`::ffff:a.b.c.d`), SIIT (`::ffff:0:a.b.c.d`), IPv4-compatible
    (`::a.b.c.d`), NAT64 (`64:ff9b::/96` and the local-use `64:ff9b:1::/48`), 6to4
    (`2002::/16`) and Teredo (`2001::/32`: its server and its client).
    """
    if isinstance(address, ipaddress.IPv4Address):
        return (address,)
    if address.ipv4_mapped is not None:
        return (address.ipv4_mapped,)
    if address.teredo is not None:
        return address.teredo
    if address.sixtofour is not None:
        return (address.sixtofour,)
    if address in _NAT64_LOCAL:
        return tuple(_rfc6052(address, length) for length in _NAT64_LOCAL_LENGTHS)
    low32 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _NAT64 or address in _SIIT:
        return (low32,)
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        return (low32,)
    return (address,)


def _rfc6052(address: ipaddress.IPv6Address, prefix_length: int) -> ipaddress.IPv4Address:
    """The IPv4 address embedded after a NAT64 prefix of this length (RFC 6052 section 2.2).

    Bits 64 to 71 (the "u" octet) are always zero and never carry address bits.
    """
    bits = f"{int(address):0128b}"
    payload = bits[:64] + bits[72:]  # drop the u octet; later offsets shift by 8
    start = prefix_length if prefix_length < 64 else prefix_length - 8
    return ipaddress.IPv4Address(int(payload[start : start + 32], 2))


def is_public(address: IPAddress) -> bool:
    """Globally routable unicast: not loopback, private, link-local, CGNAT, 0.0.0.0, ...

    An IPv6 address carrying IPv4 is public only if every IPv4 address it may carry is.
    """
    if isinstance(address, ipaddress.IPv6Address) and address in _SITE_LOCAL:
        return False
    return all(real.is_global and not real.is_multicast for real in embedded_ipv4s(address))


def allowed(host: str, address: IPAddress, allow: Iterable[str]) -> bool:
    """Public, or named by FLEET_WEB_ALLOW (a host name, an address, or a CIDR)."""
    if is_public(address):
        return True
    rules = tuple(allow)
    if any(entry.lower() == host.lower() for entry in rules):
        return True
    networks = [net for net in map(_network, rules) if net is not None]
    if any(address in net for net in networks):
        return True
    return all(any(real in net for net in networks) for real in embedded_ipv4s(address))


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None  # a host name


def resolve(host: str, port: int, allow: Iterable[str], tool: str = "web_fetch") -> Target:
    """Resolve `host` once and check every address it has; `tool` names the caller in errors.

    Raises:
        ToolError: it does not resolve, or any of its addresses is not allowed (a name with
            one public and one internal address is refused: the attacker picks which one
            a later lookup returns).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ToolError(f"cannot resolve {host!r}: {exc}") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    rules = tuple(allow)
    refused = [a for a in addresses if not allowed(host, a, rules)]
    if refused or not addresses:
        shown = refused[0] if refused else "nothing"
        raise ToolError(
            f"{tool} refuses {host!r}: it resolves to {shown}, which is not a public"
            " address (the operator may allow it with FLEET_WEB_ALLOW)"
        )
    return Target(host=host, port=port, address=str(addresses[0]))
