"""The app notices when the terminal it runs in is gone (no hangup reached it)."""

from __future__ import annotations

import os

from specchat.tui.terminal import terminal_gone


def test_a_pseudo_terminal_is_gone_once_its_other_end_closes() -> None:
    master, slave = os.openpty()
    try:
        assert not terminal_gone(slave)
        os.close(master)
        assert terminal_gone(slave)
    finally:
        os.close(slave)


def test_a_closed_descriptor_counts_as_gone() -> None:
    master, slave = os.openpty()
    os.close(master)
    os.close(slave)
    assert terminal_gone(slave)
