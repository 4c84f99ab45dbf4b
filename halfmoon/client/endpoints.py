"""Endpoint lists: ``host:port``, or several ``;``-separated (the proxies of a cluster).

A list is one *access point*, as in the official clients: one gRPC channel
whose target names every address (``ipv4:a:1,b:2``), so gRPC's ``pick_first``
policy connects to the first that answers and moves to another when that one
dies — the failover lives in the channel, and every call made through it
carries on through a live proxy. A cluster proxy answers a route with the
endpoints the client dialed, so queues name the same list and share the
channel.

Host names are resolved when the channel is made (gRPC's ``dns:`` target takes
one name only); the first name stays the channel's authority, so TLS still
checks the certificate against the name.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb


def split_endpoints(text: str) -> list[str]:
    """The ``host:port`` entries of ``text`` (``;``- or ``,``-separated), in order."""
    return [e.strip() for e in text.replace(",", ";").split(";") if e.strip()]


def _host_port(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"endpoint must be host:port, got {endpoint!r}")
    return host.strip("[]"), int(port)


def _ip_version(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


def check_endpoints(text: str) -> str:
    """``text`` if every entry is ``host:port``; ValueError naming the bad one otherwise."""
    entries = split_endpoints(text)
    if not entries:
        raise ValueError("no endpoint given; pass host:port, or several separated by ';'")
    for entry in entries:
        _host_port(entry)
    return text


def endpoints_pb(text: str) -> pb.Endpoints:
    """The protocol ``Endpoints`` naming every entry of ``text``."""
    addresses = []
    versions = set()
    for entry in split_endpoints(text):
        host, port = _host_port(entry)
        versions.add(_ip_version(host))
        addresses.append(pb.Address(host=host, port=port))
    if versions == {4}:
        scheme = pb.AddressScheme.IPv4
    elif versions == {6}:
        scheme = pb.AddressScheme.IPv6
    else:
        scheme = pb.AddressScheme.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=addresses)


def endpoints_text(endpoints: pb.Endpoints) -> str:
    """``host:port[;host:port…]`` of a protocol ``Endpoints`` ("" when it has none)."""
    out = []
    for address in endpoints.addresses:
        host = address.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        out.append(f"{host}:{address.port}")
    return ";".join(out)


def channel_target(text: str) -> tuple[str, list[tuple[str, Any]]]:
    """The gRPC target for ``text`` and the channel options it needs.

    One entry is used as is. Several become one ``ipv4:``/``ipv6:`` address list
    (host names resolved now), so the channel fails over between them."""
    entries = split_endpoints(text)
    if len(entries) == 1:
        return entries[0], []
    resolved: list[tuple[int, str, int]] = []
    names = []
    for entry in entries:
        host, port = _host_port(entry)
        version = _ip_version(host)
        if version is not None:
            resolved.append((version, host, port))
            continue
        names.append(host)
        for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            ip = str(info[4][0])
            resolved.append((6 if info[0] == socket.AF_INET6 else 4, ip, port))
    if not resolved:
        raise ValueError(f"no address for any of {text!r}")
    # gRPC's address list takes one family: the first entry's.
    first = resolved[0][0]
    seen: list[str] = []
    for version, host, port in resolved:
        address = f"[{host}]:{port}" if version == 6 else f"{host}:{port}"
        if version == first and address not in seen:
            seen.append(address)
    options: list[tuple[str, Any]] = []
    if names:
        options.append(("grpc.default_authority", f"{names[0]}:{_host_port(entries[0])[1]}"))
    return f"ipv{first}:{','.join(seen)}", options
