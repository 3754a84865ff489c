"""Imported by the DataLoader's forkserver only (kws.dataset preloads it): the forkserver dies with the
rank that started it, and the loader workers it forks die with it (kws.dataset arms them with
FORKSERVER_PID), so a killed rank leaves no idle forkserver, worker or (once those are gone)
multiprocessing resource tracker behind."""

import os

from kws.distributed import die_with_parent

FORKSERVER_PID = os.getpid()  # inherited by the workers the forkserver forks
die_with_parent()
