"""Argument types and checks shared by the `fleet` commands."""

from __future__ import annotations

import argparse
import ipaddress
import math


def integer(text: str) -> int:
    """An argparse type: any integer (the value is checked where it is used)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def number(text: str) -> float:
    """An argparse type: any number (the value is checked where it is used)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (seconds, dollars)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text!r}")
    return value


def autoscale(text: str) -> str:
    """An argparse type: `MAX,MIN` pool sizes, MAX >= MIN >= 0."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected MAX,MIN (e.g. 32,4): {text!r}")
    high, low = (int(p) for p in parts)
    if high < max(low, 1):
        raise argparse.ArgumentTypeError(f"MAX must be >= MIN and >= 1: {text!r}")
    return f"{high},{low}"


def port_number(text: str) -> int:
    """An argparse type: a TCP port."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return value


OPEN_ADDRESSES = frozenset({"127.0.0.1", "::1", "localhost"})
"""Where a console may listen without a token: this host's own loopback addresses. Not
the rest of 127.0.0.0/8 (127.0.0.2 ...): nothing there is meant to be reached, and a
rebinding page's `Host` check keyed to "loopback" let it through."""


def needs_no_token(address: str) -> bool:
    """Whether a console on `address` may go without a bearer token (`OPEN_ADDRESSES`)."""
    return address in OPEN_ADDRESSES


def is_loopback(address: str) -> bool:
    """Whether a server would listen on loopback only ('' means every interface)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
