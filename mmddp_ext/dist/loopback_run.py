"""torchrun for a single node whose rendezvous store listens on loopback only.

``torchrun --standalone`` (and every other torchrun rendezvous) hosts its TCP store on all
network interfaces (``::``), even for a job that never leaves the machine. Here the store is
created first on a socket bound to ``127.0.0.1`` with a port the OS picks, as a multi-tenant
TCPStore; torchrun's static rendezvous then opens the same host/port in this process and reuses
that server instead of listening anywhere else. Two jobs on one machine never share a port.

Run as a script (``tools/dist_train.sh`` does), so that the agent does not import mmddp_ext::

    python mmddp_ext/dist/loopback_run.py --nproc_per_node=2 [torchrun args] SCRIPT [args]
"""
import socket
import sys
from datetime import timedelta


def main(argv=None) -> None:
    """Bind the store on loopback, then hand over to torchrun (same process)."""
    import torch.distributed as dist
    from torch.distributed.run import main as torchrun_main
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(('127.0.0.1', 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    # the store owns (and closes) the listening socket from here on
    store = dist.TCPStore('127.0.0.1', port, 1, True, timedelta(seconds=300),
                          wait_for_workers=False, multi_tenant=True,
                          master_listen_fd=sock.detach())
    args = ['--nnodes=1', '--rdzv-backend=static', '--master-addr=127.0.0.1',
            f'--master-port={port}', *(sys.argv[1:] if argv is None else argv)]
    try:
        torchrun_main(args)
    finally:
        del store


if __name__ == '__main__':
    main()
