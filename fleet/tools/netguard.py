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
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class Target:
    """A checked hop: connect to `address`, but speak HTTP/TLS to `host`."""

    host: str
    port: int
    address: str


def embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address hidden in an IPv4-mapped, NAT64 or 6to4 IPv6 address, else itself."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    return address


def is_public(address: IPAddress) -> bool:
    """Globally routable unicast: not loopback, private, link-local, CGNAT, 0.0.0.0, ..."""
    real = embedded_ipv4(address)
    return real.is_global and not real.is_multicast


def allowed(host: str, address: IPAddress, allow: Iterable[str]) -> bool:
    """Public, or named by FLEET_WEB_ALLOW (a host name, an address, or a CIDR)."""
    if is_public(address):
        return True
    real = embedded_ipv4(address)
    for entry in allow:
        if entry.lower() == host.lower():
            return True
        try:
            if real in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue  # a host name that is not this one
    return False


def resolve(host: str, port: int, allow: Iterable[str]) -> Target:
    """Resolve `host` once and check every address it has.

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
            f"web_fetch refuses {host!r}: it resolves to {shown}, which is not a public"
            " address (the operator may allow it with FLEET_WEB_ALLOW)"
        )
    return Target(host=host, port=port, address=str(addresses[0]))
