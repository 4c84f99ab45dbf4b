"""Every HalfmoonError subclass maps to a protocol Code, an HTTP status and an exit code."""

from __future__ import annotations

import importlib
import pkgutil
from collections import defaultdict

import pytest
from rocketmq.grpc_protocol import definition_pb2

import halfmoon
from halfmoon.cli.admin_client import CliError
from halfmoon.config import ConfigError
from halfmoon.errors import (
    EXIT_FAILED,
    EXIT_IN_USE,
    EXIT_USAGE,
    HalfmoonError,
    InvalidArgument,
    NotFound,
    StorageError,
)
from halfmoon.server.admin import http_status
from halfmoon.server.errors import PROTOCOL_CODES, code_for
from halfmoon.store.consumequeue import QueueGapError

Code = definition_pb2.Code


def _import_all() -> None:
    for module in pkgutil.walk_packages(halfmoon.__path__, "halfmoon."):
        if module.name == "halfmoon.__main__":  # runs the CLI on import
            continue
        importlib.import_module(module.name)


def _subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


_import_all()
ERRORS = sorted(
    _subclasses(HalfmoonError) | {HalfmoonError}, key=lambda c: (c.__qualname__, c.__module__)
)


def _instance(cls: type[HalfmoonError]) -> HalfmoonError:
    error = cls.__new__(cls)  # some take more than a message; the mapping reads only the class
    error.args = ("x",)
    return error


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_the_walk_sees_errors_of_every_layer() -> None:
    modules = {c.__module__.split(".")[1] for c in ERRORS}
    assert {
        "errors",
        "store",
        "broker",
        "server",
        "client",
        "outbox",
        "spark",
        "config",
        "cluster",
    } <= modules


@pytest.mark.parametrize("cls", ERRORS, ids=_name)
def test_every_error_maps_to_a_real_protocol_code(cls: type[HalfmoonError]) -> None:
    assert cls.protocol_code in PROTOCOL_CODES, (
        f"{_name(cls)} (code {cls.code}) names no protocol Code: "
        "set protocol_code to a rocketmq Code name"
    )
    assert cls.protocol_code not in ("OK", "CODE_UNSPECIFIED")
    assert code_for(_instance(cls)) == PROTOCOL_CODES[cls.protocol_code]


@pytest.mark.parametrize("cls", ERRORS, ids=_name)
def test_every_error_has_an_http_status_and_an_exit_code(cls: type[HalfmoonError]) -> None:
    assert cls.http_status in (400, 401, 403, 404, 409, 500), _name(cls)
    assert cls.exit_code in (EXIT_FAILED, EXIT_USAGE, EXIT_IN_USE), _name(cls)


@pytest.mark.parametrize("cls", ERRORS, ids=_name)
def test_kinds_keep_their_meaning(cls: type[HalfmoonError]) -> None:
    if issubclass(cls, StorageError):  # the server's fault, never the client's
        assert (cls.protocol_code, cls.http_status) == ("INTERNAL_ERROR", 500), _name(cls)
    if issubclass(cls, InvalidArgument):
        assert cls.http_status == 400, _name(cls)
    if issubclass(cls, NotFound) and cls.__module__.startswith(
        ("halfmoon.broker", "halfmoon.store")
    ):
        assert cls.http_status == 404, _name(cls)


def test_a_storage_gap_reaches_the_client_as_internal_error() -> None:
    assert code_for(QueueGapError("t", 0, expected=5, got=7)) == Code.INTERNAL_ERROR


def test_a_code_given_when_raised_wins_when_it_is_a_protocol_code() -> None:
    assert code_for(InvalidArgument("empty", code="MESSAGE_BODY_EMPTY")) == Code.MESSAGE_BODY_EMPTY
    assert code_for(InvalidArgument("bad", code="BAD_CONFIG")) == Code.BAD_REQUEST


def test_a_new_code_does_not_inherit_its_parents_protocol_code() -> None:
    class Gap(StorageError):
        code = "SOME_NEW_GAP"

    assert Gap.protocol_code == "SOME_NEW_GAP"  # not a Code name: the walk above would fail it
    assert Gap.protocol_code not in PROTOCOL_CODES


@pytest.mark.parametrize("cls", ERRORS, ids=_name)
def test_the_admin_api_and_the_cli_use_the_class_mapping(cls: type[HalfmoonError]) -> None:
    assert http_status(_instance(cls)) == cls.http_status
    assert CliError.of(_instance(cls)).exit_code == cls.exit_code


def test_a_config_error_exits_as_a_usage_error() -> None:
    assert CliError.of(ConfigError("bad key")).exit_code == EXIT_USAGE == 2
    assert CliError.of(QueueGapError("t", 0, expected=5, got=7)).exit_code == EXIT_FAILED == 1


def test_one_class_per_refusal_outside_the_client() -> None:
    # The client keeps classes of the same names: raised from a wire status, it imports no
    # broker module. Below it, an except clause on either layer's name catches both layers.
    modules: dict[str, set[str]] = defaultdict(set)
    for cls in ERRORS:
        if not cls.__module__.startswith("halfmoon.client"):
            modules[cls.__qualname__].add(cls.__module__)
    assert {name: found for name, found in modules.items() if len(found) > 1} == {}
