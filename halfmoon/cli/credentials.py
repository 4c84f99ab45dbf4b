"""The CLI's credentials for the admin API: flags, then environment, then a file.

- ``--access-key`` / ``--secret-key`` (a secret on the command line shows in
  ``ps``: prefer the next two);
- ``HALFMOON_ACCESS_KEY`` / ``HALFMOON_SECRET_KEY``;
- a TOML file, ``$HALFMOON_CREDENTIALS_FILE`` or ``~/.config/halfmoon/credentials``,
  with ``access_key = "..."`` and ``secret_key = "..."``. It must be readable
  by its owner only (mode 600): a file others can read is refused, as ssh
  refuses such a key.

``HALFMOON_ADMIN_CA`` (or ``--admin-ca``) names the CA bundle that signed an
HTTPS admin API's certificate.
"""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path

from halfmoon import environment
from halfmoon.cli.admin_client import CliError
from halfmoon.errors import EXIT_USAGE

ACCESS_ENV = environment.ACCESS_KEY.name
SECRET_ENV = environment.SECRET_KEY.name
FILE_ENV = environment.CREDENTIALS_FILE.name
CA_ENV = environment.ADMIN_CA.name
DEFAULT_FILE = Path("~/.config/halfmoon/credentials")


def _from_file(path: Path, explicit: bool) -> tuple[str, str] | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        if explicit:
            raise CliError(
                f"credentials file {path} does not exist", "BAD_REQUEST", EXIT_USAGE
            ) from None
        return None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CliError(
            f"credentials file {path} is readable by others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"run: chmod 600 {path}",
            "BAD_REQUEST",
            EXIT_USAGE,
        )
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"credentials file {path} does not parse: {exc}", "BAD_REQUEST") from None
    access_key, secret_key = document.get("access_key"), document.get("secret_key")
    if not isinstance(access_key, str) or not isinstance(secret_key, str):
        raise CliError(
            f"credentials file {path} needs access_key and secret_key strings", "BAD_REQUEST"
        )
    return access_key, secret_key


def resolve(access_key: str | None, secret_key: str | None) -> tuple[str, str] | None:
    """The (access key, secret key) to send, or None for no credentials."""
    access_key = access_key or environment.ACCESS_KEY.get()
    secret_key = secret_key or environment.SECRET_KEY.get()
    if access_key and secret_key:
        return access_key, secret_key
    if access_key or secret_key:
        raise CliError(
            "give both an access key and a secret key (flags or "
            f"{ACCESS_ENV}/{SECRET_ENV}), or neither",
            "BAD_REQUEST",
            EXIT_USAGE,
        )
    named = environment.CREDENTIALS_FILE.get()
    return _from_file(Path(named or DEFAULT_FILE).expanduser(), explicit=bool(named))
