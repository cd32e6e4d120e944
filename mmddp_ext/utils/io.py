"""Crash-safe file writes: the one atomic write of the package (temporary file, fsync, rename,
fsync of the folder), used by checkpoints, failure records, the batch finder's cache, the
demo annotations, and (without the fsyncs: rewritten every iteration) the progress files."""
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


def atomic_write_text(path: str, text: str, durable: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`move_into_place`); creates the folder."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    part = osp.join(osp.dirname(osp.abspath(path)), f'.{osp.basename(path)}.part')
    try:
        with open(part, 'w') as f:
            f.write(text)
        move_into_place(part, path, durable)
    except BaseException:
        if osp.exists(part):
            os.remove(part)
        raise
