"""composer_jax.stopping: SIGTERM / SIGINT inside a loop become a stop request (nested blocks all
see it, a block entered later starts requested, a second SIGINT aborts); a signal that arrives
while the program starts is noted and honoured by the first block."""
import os
import signal
import time

import pytest

from composer_jax import stopping


def _send(sig):
    os.kill(os.getpid(), sig)
    time.sleep(0.05)          # the handler runs in the main thread at the next bytecode


def test_a_signal_stops_every_nested_block_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with stopping.stop_signals() as outer:
        with stopping.stop_signals() as inner:
            assert not outer.requested and not inner.requested
            _send(signal.SIGTERM)
            assert inner.requested and outer.requested and inner.signal_name == "SIGTERM"
        with stopping.stop_signals() as later:
            assert later.requested and later.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_sigint_aborts():
    with stopping.stop_signals() as flag:
        _send(signal.SIGINT)
        assert flag.requested and flag.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            _send(signal.SIGINT)


def test_a_signal_while_starting_is_honoured_by_the_first_block(capsys):
    try:
        stopping.record_early_signals()
        _send(signal.SIGTERM)
        assert "SIGTERM while starting up" in capsys.readouterr().err
        with stopping.stop_signals() as flag:
            assert flag.requested and flag.signal_name == "SIGTERM"
    finally:
        stopping._EARLY.clear()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
