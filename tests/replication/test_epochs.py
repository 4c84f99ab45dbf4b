"""Where a returning member's log and its master's part: the epoch table's answer and the cut,
through several epochs."""

from __future__ import annotations

from pathlib import Path

import pytest

from halfmoon.replication.epochs import EpochTable, divergence


def table(tmp_path: Path, name: str, entries: list[tuple[int, int]]) -> EpochTable:
    epochs = EpochTable(tmp_path / name)
    for epoch, start in entries:
        assert epochs.record(epoch, start)
    return epochs


def agree(member: EpochTable, member_end: int, master: EpochTable, master_end: int) -> int:
    """Ask and cut as the follower does until nothing is left to cut; the member's end."""
    for _ in range(10):
        asked = member.latest
        answered, end = master.end_of(asked, master_end)
        cut = divergence(member.entries, member_end, asked, answered, end)
        member.truncate(answered, cut)
        if cut >= member_end:
            return member_end
        member_end = cut
    raise AssertionError("no agreement")


def test_the_master_answers_with_the_next_epochs_start_or_its_end(tmp_path: Path) -> None:
    master = table(tmp_path, "m", [(1, 0), (2, 500), (4, 900)])
    assert master.end_of(1, 1200) == (1, 500)
    assert master.end_of(3, 1200) == (2, 900)  # epoch 3 never reached this master
    assert master.end_of(4, 1200) == (4, 1200)
    assert master.end_of(0, 1200) == (0, -1)


def test_a_deposed_masters_tail_in_its_epoch_is_cut_at_the_next_epochs_start(
    tmp_path: Path,
) -> None:
    # b0 wrote epoch 1 up to 800; the replica chosen had 600 and took office in epoch 2.
    old = table(tmp_path, "old", [(1, 0)])
    new = table(tmp_path, "new", [(1, 0), (2, 600)])
    assert agree(old, 800, new, 1000) == 600
    assert old.entries == [(1, 0)]


def test_a_member_behind_in_the_masters_epoch_cuts_nothing(tmp_path: Path) -> None:
    replica = table(tmp_path, "r", [(1, 0), (2, 600)])
    master = table(tmp_path, "m", [(1, 0), (2, 600)])
    assert agree(replica, 700, master, 1000) == 700
    assert replica.entries == [(1, 0), (2, 600)]


def test_epochs_the_master_never_had_are_walked_back(tmp_path: Path) -> None:
    # The member was master in epoch 1 and again in epoch 3 (writing 700..950) while the
    # master it returns to took epoch 2 at 600 and epoch 4 at 800: it parts at 600.
    member = table(tmp_path, "member", [(1, 0), (3, 700)])
    master = table(tmp_path, "master", [(1, 0), (2, 600), (4, 800)])
    assert agree(member, 950, master, 1200) == 600
    assert member.entries == [(1, 0)]


def test_an_empty_epoch_of_the_member_is_forgotten_without_a_cut(tmp_path: Path) -> None:
    # Took office in epoch 3 at its end (600) and wrote nothing before it was deposed.
    member = table(tmp_path, "member", [(1, 0), (3, 600)])
    master = table(tmp_path, "master", [(1, 0), (2, 600), (4, 700)])
    assert agree(member, 600, master, 900) == 600
    assert member.entries == [(1, 0)]


@pytest.mark.parametrize("member_end", [0, 300])
def test_a_master_knowing_no_epoch_that_old_cuts_nothing(tmp_path: Path, member_end: int) -> None:
    assert divergence([], member_end, 0, 0, -1) == member_end


def test_a_cut_table_survives_reopening(tmp_path: Path) -> None:
    member = table(tmp_path, "member", [(1, 0), (3, 700)])
    member.truncate(2, 600)
    assert EpochTable(tmp_path / "member").entries == [(1, 0)]
