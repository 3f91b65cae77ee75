"""A callback module that presses Ctrl-C on its own process while jsonargparse imports it to resolve its
class_path: the signal lands, every time, inside code that catches what it calls (tests/test_interrupts.py).
Never import it from anything else."""

from __future__ import annotations

import os
import signal
import time

from pytorch_lightning import Callback

os.kill(os.getpid(), signal.SIGINT)
time.sleep(5)  # the handler runs here, inside the import


class Pressed(Callback):
    pass
