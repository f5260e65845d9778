"""Entry point of a local-backend rollout worker process (started by `backend_local.ProcessPool`):

    python -m composer_jax.rl.worker_process FD '{"factory": ..., "kwargs": ..., "name": ...}'

FD is the worker's end of a socket pair with the driver. Imports no JAX. Ctrl-C in a terminal
reaches the whole process group: the worker ignores SIGINT, and the driver, which stops cleanly
on it (`composer_jax.stopping`), closes its workers.
"""
from __future__ import annotations

import json
import signal
import socket
import sys
from multiprocessing.connection import Connection


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from composer_jax.rl.backend_local import process_main  # after SIG_IGN: Ctrl-C mid-import
    fd, spec = int(argv[1]), json.loads(argv[2])
    sock = socket.socket(fileno=fd)
    process_main(Connection(sock.detach()), spec["factory"], spec["kwargs"], spec["name"])


if __name__ == "__main__":
    main(sys.argv)
