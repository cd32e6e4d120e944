"""Name GPU memory held by the wrong process: stray CUDA contexts and foreign jobs.

A DDP rank that touches CUDA before ``torch.cuda.set_device(LOCAL_RANK)`` creates a context
(and often allocates memory) on GPU 0, the device of another rank. The usual symptom is an
out-of-memory error on that other rank such as ``GPU 0 has a total capacity of 23.64 GiB of
which 59.25 MiB is free. Process 727402 has 1.89 GiB memory in use``, where pid 727402 is
rank 1's process.

This module is pure (standard library only). It compares what every rank says about itself
(:class:`RankIdentity`: host, pid, rank, device) with NVML's per-process table of each device
(:class:`DeviceTable`) and returns :class:`Finding` objects that name each problem.
"""
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..utils.ranks import ranks_text
from ..utils.units import format_bytes

CAUSES = ('Usual causes: a CUDA call before torch.cuda.set_device(LOCAL_RANK), torch.load '
          'without map_location, or torch.cuda.empty_cache() before set_device.')

KINDS = ('cross_rank', 'foreign_process', 'unmatched_pids')


@dataclass(frozen=True)
class RankIdentity:
    """What one rank says about itself; gathered from all ranks.

    Attributes:
        rank: Global rank of the process.
        host: Host name of the machine the rank runs on.
        pid: Process id of the rank, as seen by the rank itself.
        device_index: Physical (NVML) index of the rank's GPU, or None when the rank runs on
            the CPU.
    """
    rank: int
    host: str
    pid: int
    device_index: Optional[int]

    def __post_init__(self) -> None:
        _check_non_negative('rank', self.rank)
        _check_non_negative('pid', self.pid)
        if self.device_index is not None:
            _check_non_negative('device_index', self.device_index)


@dataclass(frozen=True)
class GpuProcess:
    """One row of NVML's process table of a device.

    Attributes:
        pid: Process id as NVML reports it (a pid of the host's pid namespace).
        used_bytes: GPU memory the process uses, or None when NVML does not report it.
    """
    pid: int
    used_bytes: Optional[int]

    def __post_init__(self) -> None:
        _check_non_negative('pid', self.pid)
        if self.used_bytes is not None:
            _check_non_negative('used_bytes', self.used_bytes)


@dataclass(frozen=True)
class DeviceTable:
    """NVML's process list of one device on one host.

    Attributes:
        host: Host name of the machine the device is in.
        device_index: Physical (NVML) index of the device.
        total_bytes: Total memory of the device.
        processes: The processes that hold a context on the device.
    """
    host: str
    device_index: int
    total_bytes: int
    processes: Tuple[GpuProcess, ...]

    def __post_init__(self) -> None:
        _check_non_negative('device_index', self.device_index)
        _check_non_negative('total_bytes', self.total_bytes)
        object.__setattr__(self, 'processes', tuple(self.processes))


@dataclass(frozen=True)
class Finding:
    """One named problem with the memory of a device.

    Attributes:
        kind: ``'cross_rank'`` (a rank of this job holds memory on another rank's device),
            ``'foreign_process'`` (a process outside this job holds memory on a device of this
            job) or ``'unmatched_pids'`` (none of the job's pids on a host appear in NVML's
            tables, so the other checks were skipped on that host).
        host: Host name of the device.
        device_index: Physical index of the device (for ``unmatched_pids``: the lowest device
            of the host used by the job).
        pid: The offending process, or None for ``unmatched_pids``.
        rank: The offending rank for ``cross_rank``, otherwise None.
        owner_ranks: Ranks whose device this is (for ``unmatched_pids``: all ranks with a
            device on the host), sorted.
        used_bytes: Memory the offending process holds, or None when unknown.
        message: One human-readable line describing the problem.
    """
    kind: str
    host: str
    device_index: int
    pid: Optional[int]
    rank: Optional[int]
    owner_ranks: Tuple[int, ...]
    used_bytes: Optional[int]
    message: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f'unknown finding kind {self.kind!r}; expected one of {KINDS}')
        object.__setattr__(self, 'owner_ranks', tuple(self.owner_ranks))

    def to_dict(self) -> dict:
        """A JSON-serialisable dict of all fields (``owner_ranks`` as a list)."""
        data = asdict(self)
        data['owner_ranks'] = list(self.owner_ranks)
        return data


def find_stray(ranks: Sequence[RankIdentity], tables: Sequence[DeviceTable]) -> List[Finding]:
    """Name GPU memory held by the wrong process.

    Tables of devices no rank uses are ignored; a process of the rank that owns the device is
    normal. When several tables describe the same device of the same host, the first one is
    used. Repeated rows of one pid in a table are merged (their known usage summed).

    Args:
        ranks: The identity of every rank of the job.
        tables: NVML's process tables of the devices (of any host).

    Returns:
        The findings, sorted by (host, device_index, pid).

    Raises:
        ValueError: If two identities claim the same rank.
    """
    _check_unique_ranks(ranks)
    owned = _owned_tables(ranks, tables)
    findings: List[Finding] = []
    for host in sorted({host for host, _ in owned}):
        host_tables = [owned[key] for key in sorted(owned) if key[0] == host]
        findings.extend(_host_findings(host, ranks, host_tables))
    return sorted(findings, key=_sort_key)


def _check_non_negative(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f'{name} must be a non-negative integer, got {value!r}')


def _check_unique_ranks(ranks: Sequence[RankIdentity]) -> None:
    seen: Set[int] = set()
    for ident in ranks:
        if ident.rank in seen:
            raise ValueError(f'rank {ident.rank} appears more than once in the identities')
        seen.add(ident.rank)


def _owners(ranks: Iterable[RankIdentity], host: str, device_index: int) -> Tuple[int, ...]:
    return tuple(sorted(r.rank for r in ranks if r.host == host and r.device_index == device_index))


def _owned_tables(ranks: Sequence[RankIdentity],
                  tables: Sequence[DeviceTable]) -> Dict[Tuple[str, int], DeviceTable]:
    """The first table of each (host, device) that some rank uses, rows merged by pid."""
    owned: Dict[Tuple[str, int], DeviceTable] = {}
    for table in tables:
        key = (table.host, table.device_index)
        if key not in owned and _owners(ranks, *key):
            owned[key] = _merge_rows(table)
    return owned


def _merge_rows(table: DeviceTable) -> DeviceTable:
    merged: Dict[int, Optional[int]] = {}
    for proc in table.processes:
        if proc.pid not in merged:
            merged[proc.pid] = proc.used_bytes
        elif proc.used_bytes is not None:
            merged[proc.pid] = (merged[proc.pid] or 0) + proc.used_bytes
    processes = tuple(GpuProcess(pid, used) for pid, used in sorted(merged.items()))
    return DeviceTable(table.host, table.device_index, table.total_bytes, processes)


def _host_findings(host: str, ranks: Sequence[RankIdentity],
                   tables: List[DeviceTable]) -> List[Finding]:
    host_ranks = [r for r in ranks if r.host == host]
    job_pids = {r.pid for r in host_ranks}
    listed = {p.pid for t in tables for p in t.processes}
    if listed and not listed & job_pids:
        return [_unmatched(host, host_ranks, tables)]
    findings = []
    for table in tables:
        owners = _owners(host_ranks, host, table.device_index)
        for proc in table.processes:
            finding = _process_finding(table, proc, owners, host_ranks)
            if finding is not None:
                findings.append(finding)
    return findings


def _process_finding(table: DeviceTable, proc: GpuProcess, owners: Tuple[int, ...],
                     host_ranks: List[RankIdentity]) -> Optional[Finding]:
    holders = sorted(r.rank for r in host_ranks if r.pid == proc.pid)
    if not holders:
        return _foreign(table, proc, owners)
    if set(holders) & set(owners):
        return None
    return _cross_rank(table, proc, holders[0], owners)


def _cross_rank(table: DeviceTable, proc: GpuProcess, rank: int, owners: Tuple[int,
                                                                               ...]) -> Finding:
    message = (f'rank {rank} (pid {proc.pid}) holds {format_bytes(proc.used_bytes)} on '
               f'GPU {table.device_index} of host {table.host}, the device of '
               f'{ranks_text(owners)} (total {format_bytes(table.total_bytes)}). {CAUSES}')
    return Finding('cross_rank', table.host, table.device_index, proc.pid, rank, owners,
                   proc.used_bytes, message)


def _foreign(table: DeviceTable, proc: GpuProcess, owners: Tuple[int, ...]) -> Finding:
    message = (f'pid {proc.pid} (not part of this job) holds {format_bytes(proc.used_bytes)} '
               f'on GPU {table.device_index} of host {table.host}, the device of '
               f'{ranks_text(owners)}: another job or a leftover process shares the GPU')
    return Finding('foreign_process', table.host, table.device_index, proc.pid, None, owners,
                   proc.used_bytes, message)


def _unmatched(host: str, host_ranks: List[RankIdentity], tables: List[DeviceTable]) -> Finding:
    devices = sorted(t.device_index for t in tables)
    owners = tuple(sorted(r.rank for r in host_ranks if r.device_index in devices))
    pids = ', '.join(str(p) for p in sorted({r.pid for r in host_ranks}))
    listed = ', '.join(str(p) for p in sorted({p.pid for t in tables for p in t.processes}))
    message = (f'host {host}: none of the job\'s pids ({pids}) appears in the NVML process '
               f'tables of GPU {", ".join(map(str, devices))} (pids {listed}); probably '
               f'another pid namespace (e.g. a container), so cross-rank and foreign-process '
               f'checks are skipped on this host')
    return Finding('unmatched_pids', host, devices[0], None, None, owners, None, message)


def _sort_key(finding: Finding) -> Tuple[str, int, int, str]:
    pid = -1 if finding.pid is None else finding.pid
    return (finding.host, finding.device_index, pid, finding.kind)


__all__ = [
    'CAUSES', 'DeviceTable', 'Finding', 'GpuProcess', 'RankIdentity', 'find_stray', 'format_bytes'
]
