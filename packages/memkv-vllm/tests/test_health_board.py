"""`HealthBoard` across real processes: a member one process of an engine found down is
skipped by the engine's other processes while that process lives, and no longer once it
has been killed (its mark is removed); other engines never see it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from memkv_vllm.store.health_board import HealthBoard
from waiting import wait_until

MEMBER = "127.0.0.1:9901"

OWNER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from memkv_vllm.store.health_board import HealthBoard

    board = HealthBoard("engine-a", Path(sys.argv[1]))
    board.found_down(sys.argv[2], lambda: True)  # down for as long as this process runs
    print("marked", flush=True)
    time.sleep(120)
    """
)


def test_a_mark_is_followed_while_its_owner_lives_and_dropped_once_it_is_killed(
    tmp_path: Path,
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path), MEMBER],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "marked"  # or it died: EOF
        same_engine = HealthBoard("engine-a", tmp_path)
        other_engine = HealthBoard("engine-b", tmp_path)
        assert [p.suffix for p in tmp_path.iterdir()] == [".down"]

        assert same_engine.skip(MEMBER)
        assert same_engine.went_down == {MEMBER: 1}
        assert not other_engine.skip(MEMBER)

        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert not same_engine.skip(MEMBER)
        assert same_engine.came_up == {MEMBER: 1}
        assert list(tmp_path.iterdir()) == []  # the dead owner's mark is gone
    finally:
        owner.kill()
        owner.wait(10)


def test_a_mark_of_this_store_is_not_skipped_here_and_is_cleared_when_the_member_is_up(
    tmp_path: Path,
) -> None:
    board = HealthBoard("engine-a", tmp_path)
    down = True
    board.found_down(MEMBER, lambda: down)
    assert not board.skip(MEMBER)  # its own verdict: this store's record decides here
    assert HealthBoard("engine-a", tmp_path).skip(MEMBER)
    down = False  # this store's probe finds it answering: the watcher removes the mark
    wait_until(lambda: not list(tmp_path.iterdir()), timeout=5)
    board.close()
