"""The AMQP clients' own test suites, pinned, fetched at test time, never committed.

Each suite is pinned to one release of its client and to the git commit of
that release. Where the tests come from, first that answers:

1. ``HALFMOON_PEER_SUITES_MIRROR`` (default ``/work/.mirror``): a git directory
   ``OWNER+NAME/repo`` holding the pinned commit (``git archive`` of it). A
   development machine may have one; a fresh CI clone has none.
2. The release's sdist from PyPI, when it carries the tests (aiormq's and
   aio-pika's do; no pika sdist does), checked against its sha256.
3. GitHub's archive of the pinned commit (pika's only source off a mirror).

The suites run in a virtual environment of their own (``.peer-suites/venv``):
their conftests need aiomisc-pytest, which as an installed pytest plugin
would change every one of halfmoon's own tests. That environment holds the
pinned client release itself, so the tests and the library they test agree.
Everything lands under ``.peer-suites/`` at the repository root (ignored by git).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".peer-suites"
MIRROR_ENV = "HALFMOON_PEER_SUITES_MIRROR"
DEFAULT_MIRROR = "/work/.mirror"


@dataclass(frozen=True)
class Suite:
    """One client's test suite at one release."""

    name: str  # the PyPI name
    version: str
    repo: str  # GitHub OWNER/NAME
    commit: str  # the release's commit
    sdist_url: str  # PyPI's file, "" when the sdist carries no tests
    sdist_sha256: str

    @property
    def directory(self) -> Path:
        return WORK / "src" / f"{self.name}-{self.version}"

    @property
    def archive_url(self) -> str:
        return f"https://codeload.github.com/{self.repo}/tar.gz/{self.commit}"


# pika 1.4.4's sdist has no tests: its tag's commit is the source. aiormq 7.2.4 and
# aio-pika 10.2.1 (the releases halfmoon's own environment installs) ship theirs in the
# sdist; their commits are the releases' tags upstream.
PYPI_FILES = "https://files.pythonhosted.org/packages"
PIKA = Suite(
    name="pika", version="1.4.4", repo="pika/pika",
    commit="60fee4203a30d5dfa0500857cea6a65ef571d46c", sdist_url="", sdist_sha256="",
)  # fmt: skip
AIORMQ = Suite(
    name="aiormq", version="7.2.4", repo="mosquito/aiormq", commit="",
    sdist_url=f"{PYPI_FILES}/71/11/8b93eac7630c5087c34df3d34ce0bdf50d6ea2fb83061f17e8c73877141d/aiormq-7.2.4.tar.gz",
    sdist_sha256="5fd20bb9583d73de85572198496b65cf028f27527c1733c9840d458e0b40e8fa",
)  # fmt: skip
AIO_PIKA = Suite(
    name="aio-pika", version="10.2.1", repo="mosquito/aio-pika", commit="",
    sdist_url=f"{PYPI_FILES}/5d/31/70f0d7a9fe1affc3241d86d24c24714a4a2ac648961efd3d835ef734a6a1/aio_pika-10.2.1.tar.gz",
    sdist_sha256="e4f77afd9179a3cca5a904c3b0a1190256a36d9f90650db908b1b2245eb27487",
)  # fmt: skip
SUITES = (PIKA, AIORMQ, AIO_PIKA)

# What the suites' conftests and adapters import, beside the clients themselves.
# tornado and gevent run pika's async tests on those I/O loops too.
VENV_PACKAGES = (
    "pytest>=8.4,<10", "pytest-timeout", "aiomisc", "aiomisc-pytest>=2,<3", "yarl",
    "tornado", "gevent", "cryptography", "shortuuid", "timeout-decorator",
)  # fmt: skip
PLUGIN_DIR = Path(__file__).resolve().parent / "plugin"


class SuiteUnavailable(RuntimeError):
    """The suite's tests could be had from none of their sources."""


@contextmanager
def _locked() -> Iterator[None]:
    """One test process at a time prepares ``.peer-suites`` (xdist workers, parallel runs)."""
    WORK.mkdir(exist_ok=True)
    with open(WORK / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _mirror_git_dir(suite: Suite) -> Path | None:
    if not suite.commit:
        return None
    root = Path(os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR)
    git_dir = root / suite.repo.replace("/", "+") / "repo"
    if not git_dir.is_dir():
        return None
    found = subprocess.run(
        ["git", "-C", str(git_dir), "cat-file", "-e", f"{suite.commit}^{{commit}}"],
        capture_output=True,
    )
    return git_dir if found.returncode == 0 else None


def _download(url: str, sha256: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - a pinned https URL
        data: bytes = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 and digest != sha256:
        raise SuiteUnavailable(f"{url}: sha256 {digest}, pinned {sha256}")
    return data


def _unpack(data: bytes, into: Path) -> None:
    """A source tarball's single top directory becomes ``into``."""
    with (
        tempfile.TemporaryDirectory(dir=WORK) as scratch,
        tarfile.open(fileobj=io.BytesIO(data)) as tar,
    ):
        tar.extractall(scratch, filter="data")
        (top,) = Path(scratch).iterdir()
        shutil.move(str(top), into)


def fetch(suite: Suite) -> Path:
    """The suite's source tree (its ``tests/`` and its pytest settings), fetched once."""
    target = suite.directory
    with _locked():
        if (target / "tests").is_dir():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        errors: list[str] = []
        git_dir = _mirror_git_dir(suite)
        if git_dir is not None:
            tar = subprocess.run(
                ["git", "-C", str(git_dir), "archive", "--prefix=src/", suite.commit],
                capture_output=True, check=True,
            )  # fmt: skip
            _unpack(tar.stdout, target)
            return target
        errors.append(f"no mirror of {suite.repo} at {suite.commit or '(no commit pinned)'}")
        sources = []
        if suite.sdist_url:
            sources.append((suite.sdist_url, suite.sdist_sha256))
        if suite.commit:
            # GitHub's archives are not byte-stable: the commit in the URL is the pin.
            sources.append((suite.archive_url, ""))
        for url, sha256 in sources:
            try:
                _unpack(_download(url, sha256), target)
                return target
            except Exception as exc:  # noqa: BLE001 - try the next source, report them all
                errors.append(f"{url}: {exc!r}")
        raise SuiteUnavailable(f"{suite.name} {suite.version}'s tests: " + "; ".join(errors))


def venv_python() -> Path:
    """The suites' own interpreter, with every pinned client and the suites' test tools."""
    venv = WORK / "venv"
    python = venv / "bin" / "python"
    wanted = sorted([*VENV_PACKAGES, *(f"{s.name}=={s.version}" for s in SUITES)])
    digest = hashlib.sha1("\n".join(wanted).encode()).hexdigest()[:12]
    stamp = venv / f".installed-{digest}"
    with _locked():
        if stamp.exists():
            return python
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, *wanted], check=True)
        for old in venv.glob(".installed-*"):
            old.unlink()
        stamp.touch()
    return python
