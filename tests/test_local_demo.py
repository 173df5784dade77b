"""The in-process demo: crash, restore from the latest checkpoint, exact output."""

from __future__ import annotations

import pytest

from spark_jobs.commands.local_demo import run_demo
from spark_jobs.commands.main import main
from state.catalog import CheckpointStatus


@pytest.mark.parametrize("lose_local_copies", [False, True])
def test_crash_and_restore_gives_exact_counts(tmp_path, lose_local_copies):
    result = run_demo(
        tmp_path / "home",
        batches=16,
        batch_size=2_000,
        users=5_000,
        crash_after=11,
        lose_local_copies=lose_local_copies,
        log=lambda *_: None,
    )
    assert result.exact and result.counted == result.expected == 16 * 2_000
    assert result.restored_from is not None
    sources = {r.source for r in result.restore_reports}
    assert sources == ({"remote"} if lose_local_copies else {"local"})
    statuses = [c.status for c in result.completed]
    assert statuses[-2:] == [CheckpointStatus.COMPLETED] * 2  # num_retained=2
    assert set(statuses[:-2]) == {CheckpointStatus.SUBSUMED}
    assert {c.attempt for c in result.completed} == {1, 2}


def test_cli_verify_checks_every_file(tmp_path, capsys):
    run_demo(tmp_path / "home", batches=8, batch_size=1_000, crash_after=6, log=lambda *_: None)
    root = tmp_path / "home" / "checkpoints"
    assert main(["verify", "demo_counts", "--checkpoint-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "chk-1: ok" in out
    # A flipped byte in a shared file is found by its checksum.
    victim = sorted((root / "demo_counts" / "shared").rglob("*.sst"))[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert main(["verify", "demo_counts", "--checkpoint-root", str(root)]) == 1
    assert "checksum mismatch" in capsys.readouterr().out
    assert main(["verify", "no_such_job", "--checkpoint-root", str(root)]) == 2  # unknown
    assert "no job named 'no_such_job'" in capsys.readouterr().err
    assert main(["verify", "../escape", "--checkpoint-root", str(root)]) == 2
    assert "escapes" in capsys.readouterr().err
