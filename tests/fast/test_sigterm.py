"""sigterm.py: SIGTERM (and, for a server's start, SIGHUP) stop a block as Ctrl-C does, and the
handlers before it come back after."""

import os
import signal
import time

import pytest

from tandem.sigterm import sigterm_interrupts


def test_a_hangup_during_a_servers_start_is_an_interrupt_and_its_handler_comes_back():
    """SIGHUP before the server listened ended it with 129 and no word (its SIGTERM said
    "interrupted" and exited 130); once serving, SIGHUP drains as SIGTERM does."""
    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_interrupts(hang_up=True):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)  # the handler raises at once, cutting the sleep short
    assert signal.getsignal(signal.SIGHUP) is before
    with pytest.raises(KeyboardInterrupt):
        with sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)


def test_an_ignored_hangup_stays_ignored():
    """Under nohup SIGHUP is ignored, and a start must not take that away."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with sigterm_interrupts(hang_up=True):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # nothing happens
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
