"""SIGTERM as Ctrl-C: `timeout` and `kill` stop a command the way a KeyboardInterrupt does, so
that its `finally` blocks and atexit handlers run (the servers a bench started are stopped, a Ray
cluster's processes are shut down). The default action ends the process at once."""

import contextlib
import signal
import threading


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def keeping_sigterm_handler(signals: tuple[int, ...] = (signal.SIGTERM,)):
    """Puts SIGTERM's handler (and those of the other `signals`) back after the block
    (`ray.init` replaces it with its own, which exits from wherever the main thread is). Only the
    main thread may set handlers: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in signals}
    try:
        yield
    finally:  # None: a handler set outside Python, which only the default can stand for
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def sigterm_interrupts(hang_up: bool = False):
    """Within the block SIGTERM raises KeyboardInterrupt, and with `hang_up` SIGHUP too (unless
    it is ignored, as under nohup: a server's start, whose SIGHUP once serving drains as SIGTERM
    does, ended at once with 129 and no word before it listened); the handlers before are put
    back after."""
    hang_up_signal = getattr(signal, "SIGHUP", None) if hang_up else None
    signals = (signal.SIGTERM,) + ((hang_up_signal,) if hang_up_signal is not None
                                   and signal.getsignal(hang_up_signal) is not signal.SIG_IGN else ())
    with keeping_sigterm_handler(signals):
        if threading.current_thread() is threading.main_thread():
            for signum in signals:
                signal.signal(signum, interrupt)
        yield


@contextlib.contextmanager
def deferring_ctrl_c():
    """Ctrl-C within the block is held until it ends, then raised there, and so is SIGTERM where
    it interrupts (`sigterm_interrupts`). For a call an interrupt must not cut in two: one inside
    Ray's core-worker constructor (`ray.init`) leaves a driver that crashes the process at exit
    (SIGSEGV, after `interrupted` was said); and for C code that calls back into Python (llama.cpp's
    log callback), where a KeyboardInterrupt raised in the callback is swallowed and the
    interrupt lost. Main thread only: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    signals = [signal.SIGINT] + [signum for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None))
                                 if signum is not None and signal.getsignal(signum) is interrupt]
    previous = {signum: signal.signal(signum, lambda signum, frame: held.append(signum)) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if held:  # the user's stop wins over the block's own failure
            raise KeyboardInterrupt
