"""What this node has for a job, read where the kernel says it: host memory (the cgroup's limit
where one is set, else the RAM), the size of /dev/shm, the CPU cores this process may run on
(its affinity, within the cgroup's CPU quota), and how many processes the OOM killer of this
process's memory cgroup has ended. None where a number cannot be read."""
import math
import os
import os.path as osp
from typing import Optional

from ..utils.memory_reads import host_memory_bytes
from .limits import NodeFacts

CGROUP = '/sys/fs/cgroup'


def node_facts(shm: str = '/dev/shm', cgroup: str = CGROUP) -> NodeFacts:
    """This node's :class:`~mmddp_ext.node.limits.NodeFacts`."""
    return NodeFacts(host_memory=host_memory(cgroup), shm_size=shm_size(shm), cpus=cpus(cgroup))


def shm_size(path: str = '/dev/shm') -> Optional[int]:
    """Bytes of the file system at ``path`` (/dev/shm), or None where there is none."""
    st = _statvfs(path)
    return None if st is None else st.f_blocks * st.f_frsize


def shm_free(path: str = '/dev/shm') -> Optional[int]:
    """Bytes free at ``path`` (/dev/shm), or None where there is none."""
    st = _statvfs(path)
    return None if st is None else st.f_bavail * st.f_frsize


def _statvfs(path: str) -> Optional[os.statvfs_result]:
    try:
        return os.statvfs(path)
    except OSError:
        return None


def host_memory(cgroup: str = CGROUP) -> int:
    """The RAM, or the cgroup's memory limit where that is lower (a container's)."""
    limit = memory_limit(cgroup) or memory_limit(osp.join(cgroup, 'memory'))  # v2, else v1
    return limit or host_memory_bytes()


def cpus(cgroup: str = CGROUP) -> Optional[int]:
    """The cores this process may run on: its affinity, within the cgroup's CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count()
    quota = _cpu_quota(cgroup)
    if count is None:
        return quota
    return min(count, quota) if quota else count


def _cpu_quota(cgroup: str) -> Optional[int]:
    """Cores the cgroup allows (``cpu.max``: quota and period in µs), rounded up."""
    try:
        with open(osp.join(cgroup, 'cpu.max')) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == 'max':
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def _read_number(path: str) -> Optional[int]:
    """The integer in ``path``; None where it is missing, 'max' or not a number."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def memory_cgroup(proc_cgroup: str = '/proc/self/cgroup', root: str = CGROUP) -> Optional[str]:
    """The folder of this process's memory cgroup: cgroup v1's ``memory`` controller where
    mounted, else cgroup v2's; the root where the path is not under it (a container's cgroup
    namespace shows its own cgroup as the root). None where there is none."""
    try:
        with open(proc_cgroup) as f:
            lines = [line.strip().split(':', 2) for line in f if line.count(':') >= 2]
    except OSError:
        return None
    v1 = [path for _, controllers, path in lines if 'memory' in controllers.split(',')]
    v2 = [path for number, controllers, path in lines if number == '0' and not controllers]
    for base, paths in ((osp.join(root, 'memory'), v1), (root, v2)):
        if paths and osp.isdir(base):
            folder = osp.join(base, paths[0].lstrip('/'))
            return folder if osp.isdir(folder) else base
    return None


def memory_limit(folder: Optional[str]) -> Optional[int]:
    """The memory limit of the cgroup at ``folder`` (``memory.max``, v2, or
    ``memory.limit_in_bytes``, v1), or None where it has none below the host's RAM."""
    if not folder:
        return None
    for name in ('memory.max', 'memory.limit_in_bytes'):
        limit = _read_number(osp.join(folder, name))
        if limit is not None:
            return limit if limit < host_memory_bytes() else None
    return None


def oom_kills(folder: Optional[str]) -> Optional[int]:
    """Processes the OOM killer has ended in the memory cgroup at ``folder``: ``oom_kill`` of
    its ``memory.events`` (v2) or ``memory.oom_control`` (v1); None where unreadable."""
    if not folder:
        return None
    for name in ('memory.events', 'memory.oom_control'):
        try:
            with open(osp.join(folder, name)) as f:
                for line in f:
                    key, _, value = line.partition(' ')
                    if key == 'oom_kill':
                        return int(value)
        except (OSError, ValueError):
            continue
    return None
