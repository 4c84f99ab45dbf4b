"""The permissive front's relay on its own, with two echo servers standing in for gRPC's
loopback listeners: routing by first byte, the client's address in the side table, large
transfers through flow control, half-close, and IPv4 clients of a ``::`` listener."""

from __future__ import annotations

import asyncio
import socket

import pytest

from halfmoon.server.client_address import SPLICED, grpc_peer
from halfmoon.server.permissive_grpc import PermissiveFront


class Inner:
    """An echo server: answers ``<name> <client as the side table says>\\n``, then echoes
    every byte until the relay half-closes, then says ``bye`` and closes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0

    async def start(self) -> Inner:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self.server = server
        return self

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = writer.get_extra_info("peername")[:2]
        client = SPLICED.resolve(grpc_peer(host, port))
        writer.write(f"{self.name} {client}\n".encode())
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.write(b"bye")
        await writer.drain()
        writer.close()


async def front_with_inners(host: str = "127.0.0.1") -> tuple[PermissiveFront, int]:
    tls, plain = await Inner("tls").start(), await Inner("plain").start()
    front = PermissiveFront(
        host, 0, tls_target=("127.0.0.1", tls.port), plain_target=("127.0.0.1", plain.port)
    )
    port = await front.bind()
    await front.serve()
    return front, port


async def exchange(host: str, port: int, payload: bytes) -> tuple[str, bytes, str]:
    reader, writer = await asyncio.open_connection(host, port)
    sockname = writer.get_extra_info("sockname")
    writer.write(payload)
    await writer.drain()
    writer.write_eof()
    greeting = (await reader.readline()).decode().strip()
    rest = await reader.read()  # the echo, then "bye", then EOF
    writer.close()
    return greeting, rest, grpc_peer(sockname[0], sockname[1])


def test_first_byte_routes_and_the_client_address_survives() -> None:
    async def scenario() -> None:
        front, port = await front_with_inners()
        try:
            greeting, rest, me = await exchange("127.0.0.1", port, b"\x16\x03\x01hello")
            assert greeting == f"tls {me}" and rest == b"\x16\x03\x01hello" + b"bye"
            greeting, rest, me = await exchange("127.0.0.1", port, b"PRI * HTTP/2.0\r\n")
            assert greeting == f"plain {me}" and rest == b"PRI * HTTP/2.0\r\nbye"
        finally:
            await front.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_large_transfer_passes_whole_through_flow_control() -> None:
    async def scenario() -> None:
        front, port = await front_with_inners()
        payload = b"PRI" + bytes(range(256)) * (32 * 1024)  # 8 MiB and a bit
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(payload[:3])  # the first bytes choose the inner server, which greets
            await reader.readline()

            async def send() -> None:
                writer.write(payload[3:])
                await writer.drain()
                writer.write_eof()

            sending = asyncio.create_task(send())
            received = bytearray()
            while chunk := await reader.read(7000):  # a slow-ish reader: small reads
                received += chunk
            await sending
            writer.close()
            assert bytes(received) == payload + b"bye"
        finally:
            await front.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_silent_or_vanishing_clients_leave_nothing_behind() -> None:
    async def scenario() -> None:
        front, port = await front_with_inners()
        front.sniff_timeout = 0.2
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()  # connect and go
            reader, _ = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 10) == b""  # silent: closed by the front
            greeting, _, me = await exchange("127.0.0.1", port, b"PRI")
            assert greeting == f"plain {me}"
            for _ in range(100):
                if not front.relays:
                    break
                await asyncio.sleep(0.05)
            assert not front.relays
        finally:
            await front.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_an_ipv6_wildcard_front_serves_ipv4_clients_as_ipv4() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")

    async def scenario() -> None:
        try:
            front, port = await front_with_inners("::")
        except OSError as exc:
            pytest.skip(f"cannot listen on :: ({exc})")
        try:
            greeting, _, me = await exchange("127.0.0.1", port, b"PRI")
            assert greeting == f"plain {me}" and me.startswith("ipv4:127.0.0.1:")
        finally:
            await front.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
