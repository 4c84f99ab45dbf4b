"""``halfmoon completion bash|zsh``: scripts made from the parser; the bash one completes in
a real bash, with COMP_WORDS set as bash sets them, and the zsh one in a real interactive zsh
(Debian's, ``./run test`` installs it) driven through a pseudo-terminal, Tab pressed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from halfmoon.cli.completion_command import command_tree
from halfmoon.cli.main import build_parser


def _script(shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "halfmoon", "completion", shell],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def bash_script() -> str:
    return _script("bash")


def _complete(script: str, *words: str) -> list[str]:
    """What the completion offers for ``words`` (the last one being typed), in bash."""
    quoted = " ".join("'" + w + "'" for w in words)
    program = (
        f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _halfmoon; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, timeout=30, check=True
    )
    return [line for line in done.stdout.splitlines() if line]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (("halfmoon", "top"), ["topic"]),
        (("halfmoon", "outbox", "re"), ["relay", "replay"]),
        (("halfmoon", "--json", "transaction", "com"), ["commit"]),
        (("halfmoon", "topic", "update", "orders", "--que"), ["--queues"]),
        (("halfmoon", "completion", ""), []),  # a positional: nothing to offer
    ],
)
def test_bash_completes_commands_and_options(
    bash_script: str, words: tuple[str, ...], expected: list[str]
) -> None:
    assert _complete(bash_script, *words) == expected


ZSH = Path(os.environ.get("HALFMOON_ZSH", "/usr/bin/zsh"))

# Runs in `zsh -f`: starts an interactive `zsh -f` on a pseudo-terminal (zsh/zpty), loads
# compinit and the script there as ~/.zshrc would, then types each line with a Tab and a
# Ctrl-T, bound to a widget that writes the edited line to a file (Ctrl-X would be a prefix
# key). `compadd` is wrapped to write what _halfmoon offered (one file per line typed), so
# both a unique completion (the line grows) and an ambiguous one (the offers) are seen. The
# last command prints END-OF-$((6*7)): its echo does not match the pattern, its output does.
ZSH_DRIVER = r"""
zmodload zsh/zpty
zpty -b shell zsh -f -i
zpty -w shell "PS1='> '; autoload -Uz compinit; compinit -u -D; source ${(q)script}"
zpty -w shell "print -r -- \${_comps[halfmoon]} > ${(q)out}/registered"
zpty -w shell "n=0; compadd() { [[ \$funcstack[2] == _halfmoon ]] && \
  print -rl -- \"\${@[2,-1]}\" >> ${(q)out}/offered.\$n; builtin compadd \"\$@\"; }"
zpty -w shell "record() { print -r -- \"\$BUFFER\" > ${(q)out}/line.\$n; (( n++ )); \
  BUFFER=; }; zle -N record; bindkey '^T' record"
for typed in "${(@f)lines}"; do zpty -w -n shell "$typed"$'\t\C-t'; done
zpty -w shell 'print -r -- END-OF-$((6*7))'
zpty -r shell output '*END-OF-42*'
zpty -d shell
"""


def _complete_in_zsh(script: Path, out: Path, lines: list[str]) -> list[tuple[str, list[str]]]:
    """Each line typed into an interactive zsh and completed with Tab: the line after the
    completion and what _halfmoon offered."""
    if not ZSH.exists():
        message = f"{ZSH} is missing: ./run test installs Debian's zsh"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, "script": str(script), "out": str(out), "lines": "\n".join(lines)}
    env.pop("ZDOTDIR", None)
    subprocess.run(
        [str(ZSH), "-f", "-c", ZSH_DRIVER], env=env, timeout=120, check=True, capture_output=True
    )
    assert (out / "registered").read_text().strip() == "_halfmoon"  # compdef took it
    results = []
    for n in range(len(lines)):
        offered = out / f"offered.{n}"
        words = offered.read_text().split() if offered.exists() else []
        results.append(((out / f"line.{n}").read_text().rstrip("\n"), words))
    return results


def test_zsh_loads_the_script_and_completes_on_tab(tmp_path: Path) -> None:
    script = tmp_path / "_halfmoon.zsh"
    script.write_text(_script("zsh"))
    out = tmp_path / "out"
    out.mkdir()
    lines = [
        "halfmoon top",
        "halfmoon outbox re",
        "halfmoon --json transaction com",
        "halfmoon topic update orders --que",
    ]
    results = _complete_in_zsh(script, out, lines)
    line, offered = results[0]
    assert line == "halfmoon topic "
    assert "topic" in offered and "serve" in offered  # compadd filters by the prefix typed
    line, offered = results[1]
    assert line.startswith("halfmoon outbox re") and line != "halfmoon outbox relay "
    assert {"relay", "replay"} <= set(offered)
    assert results[2][0] == "halfmoon --json transaction commit "
    assert results[3][0] == "halfmoon topic update orders --queues "


def test_every_command_is_in_both_scripts(bash_script: str) -> None:
    zsh = _script("zsh")
    tree = command_tree(build_parser())
    top = tree["halfmoon"][0]
    assert {"serve", "topic", "outbox", "transaction", "completion"} <= set(top)
    for path, (children, _options) in tree.items():
        for script in (bash_script, zsh):
            assert f"'{path}'" in script, path
            for child in children:
                assert f"'{path} {child}'" in script, (path, child)
    assert "complete -o default -F _halfmoon halfmoon" in bash_script
    assert zsh.startswith("#compdef halfmoon")


def test_an_unknown_shell_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "halfmoon", "completion", "fish"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "invalid choice" in done.stderr
