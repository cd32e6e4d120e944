"""Crash-safe file writes: the one atomic write of the package (temporary file, fsync, rename,
fsync of the folder), used by checkpoints, failure records, the batch finder's cache, the
demo annotations, a checkpoint sent to a node without it, and (without the fsyncs: rewritten
every iteration) the progress files."""
import os
import os.path as osp


def fsync_path(path: str) -> None:
    """Flush a file's or a folder's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def move_into_place(part: str, path: str, durable: bool = True) -> None:
    """Make the complete temporary file ``part`` appear as ``path`` in one step: a reader
    sees the old file or the new one, never half of one. ``durable`` also survives a crash of
    the host (fsync of the file and of its folder); without it, only of the process."""
    if durable:
        fsync_path(part)
    os.replace(part, path)
    if durable:
        fsync_path(osp.dirname(osp.abspath(path)))


def atomic_write_bytes(path: str, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`move_into_place`); creates the folder.
    The temporary file is named for this process, so processes writing the same path at once
    (the ranks of one node) each leave it whole."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    part = osp.join(osp.dirname(osp.abspath(path)), f'.{osp.basename(path)}.{os.getpid()}.part')
    try:
        with open(part, 'wb') as f:
            f.write(data)
        move_into_place(part, path, durable)
    except BaseException:
        if osp.exists(part):
            os.remove(part)
        raise


def atomic_write_text(path: str, text: str, durable: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode('utf-8'), durable)
