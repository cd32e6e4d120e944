"""What one node's ranks and their DataLoader workers ask of the node, against what it has: host
memory, shared memory (/dev/shm) for the batches in flight, CPU threads, and the batch each
BatchNorm layer sees. Pure: numbers in, :class:`Figure` rows out (docs/memory.md, "The node's
own limits").

Example: 8 ranks on a node, 4 workers each, prefetch_factor 2, 24 MiB batches -> 8 × 4 × 2 ×
24 MiB = 1.5 GiB of /dev/shm in flight; Docker's default /dev/shm is 64 MiB.
"""
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

from ..utils.units import format_bytes

# what makes room for the batches DataLoader workers hand over through /dev/shm (torch's
# 'file_system' sharing strategy keeps them in /dev/shm too: it helps with open files, not space)
SHM_FIX = ('a larger /dev/shm (docker run --shm-size=8g; on Kubernetes an emptyDir of medium '
           'Memory at /dev/shm), or fewer batches in flight: fewer workers '
           '(train_dataloader.num_workers) or a smaller train_dataloader.prefetch_factor')
BN_MIN_BATCH = 8  # samples per BatchNorm below which its statistics get noisy (SyncBN fixes it)
BN_FIX = ("SyncBN normalises over every rank's samples: sync_bn='torch' in the config "
          "(--cfg-options sync_bn=torch; MMEngine converts every BatchNorm on GPU ranks), or a "
          f"per-device batch of at least {BN_MIN_BATCH}")


@dataclass(frozen=True)
class NodeLoad:
    """What one node's share of the run asks for.

    Attributes:
        ranks_per_node: training processes on this node.
        num_workers: DataLoader workers per rank (train_dataloader.num_workers).
        prefetch_factor: batches each worker loads ahead (PyTorch's default 2).
        batch_bytes: one rank's training batch as a worker hands it over (None: not measured).
        process_bytes: one rank's own memory on the host (None: not measured).
        worker_bytes: one worker's own memory, beyond what it shares with its rank (None: not
            measured).
        threads_per_process: the intra-op threads each rank computes with.
        bn_batch: samples each plain BatchNorm layer normalises over (the per-device batch, or
            the micro-batch where the plan splits it); None where the model has none.
    """

    ranks_per_node: int
    num_workers: int
    prefetch_factor: int = 2
    batch_bytes: Optional[int] = None
    process_bytes: Optional[int] = None
    worker_bytes: Optional[int] = None
    threads_per_process: int = 1
    bn_batch: Optional[int] = None


@dataclass(frozen=True)
class NodeFacts:
    """What the node has: host memory, /dev/shm and CPU cores for this job (None: unknown)."""

    host_memory: Optional[int] = None
    shm_size: Optional[int] = None
    cpus: Optional[int] = None


@dataclass(frozen=True)
class Figure:
    """One of the node's figures: what the run needs, what the node has, whether it fits
    (None where a number is unknown), how it was counted, and the fix where it does not fit."""

    name: str
    need: Optional[float]
    have: Optional[float]
    fits: Optional[bool]
    how: str
    fix: str = ''

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def node_figures(load: NodeLoad, facts: NodeFacts) -> List[Figure]:
    """The four figures of one node, in the order ``--explain`` shows them."""
    return [_host(load, facts), _shared(load, facts), _threads(load, facts), _batchnorm(load)]


def _fits(need: Optional[float], have: Optional[float]) -> Optional[bool]:
    return None if need is None or have is None else need <= have


def _host(load: NodeLoad, facts: NodeFacts) -> Figure:
    n, w = load.ranks_per_node, load.num_workers
    if load.process_bytes is None or (w and load.worker_bytes is None):
        need, how = None, 'not measured (--explain --memory measures a rank and a worker)'
    else:
        need = n * (load.process_bytes + w * (load.worker_bytes or 0))
        how = (f'{n} rank(s) × ({format_bytes(load.process_bytes)} + {w} worker(s) × '
               f'{format_bytes(load.worker_bytes or 0)})')
    fits = _fits(need, facts.host_memory)
    fix = '' if fits is not False else (
        'fewer DataLoader workers (train_dataloader.num_workers) or fewer ranks on this node; '
        'the kernel\'s OOM killer would end one process with SIGKILL')
    return Figure('host memory', need, facts.host_memory, fits, how, fix)


def _shared(load: NodeLoad, facts: NodeFacts) -> Figure:
    n, w, p = load.ranks_per_node, load.num_workers, load.prefetch_factor
    if w == 0:
        need, how = 0, 'no DataLoader workers: batches do not pass through shared memory'
    elif load.batch_bytes is None:
        need, how = None, 'batch size in bytes not measured'
    else:
        need = n * w * p * load.batch_bytes
        how = (f'{n} rank(s) × {w} worker(s) × prefetch_factor {p} × '
               f'{format_bytes(load.batch_bytes)} per batch')
    fits = _fits(need, facts.shm_size)
    fix = '' if fits is not False else SHM_FIX
    return Figure('shared memory', need, facts.shm_size, fits, how, fix)


def _threads(load: NodeLoad, facts: NodeFacts) -> Figure:
    """Busy threads: each rank's intra-op threads and its workers (one thread each: PyTorch
    sets 1 in a worker, MMEngine turns OpenCV's own threads off)."""
    n, t, w, cores = load.ranks_per_node, load.threads_per_process, load.num_workers, facts.cpus
    need = n * (t + w)
    fits = _fits(need, cores)
    fix = ''
    if fits is False:
        per_rank = cores // n
        if per_rank < 1:
            fix = (f'more ranks than cores on this node ({n} > {cores}): each rank gets less '
                   'than a core, so the run is slow, not wrong')
        else:
            fix = (
                f'{cores} cores for {n} rank(s): OMP_NUM_THREADS={max(1, per_rank - w)}' +
                (f' and train_dataloader.num_workers={per_rank - 1}' if per_rank - 1 < w else ''))
    return Figure('threads', need, cores, fits, f'{n} rank(s) × ({t} thread(s) + {w} worker(s))',
                  fix)


def _batchnorm(load: NodeLoad) -> Figure:
    """``need``: the samples a BatchNorm wants (:data:`BN_MIN_BATCH`); ``have``: what each of
    the model's plain BatchNorm layers gets on one device."""
    if load.bn_batch is None:
        return Figure('batchnorm batch', BN_MIN_BATCH, None, None,
                      'no plain BatchNorm in the model (SyncBN, GroupNorm or none)')
    fits = _fits(BN_MIN_BATCH, load.bn_batch)
    fix = '' if fits else BN_FIX
    return Figure('batchnorm batch', BN_MIN_BATCH, load.bn_batch, fits,
                  f'each BatchNorm layer normalises over {load.bn_batch} sample(s) per device', fix)


def batchnorm_warning(layers: int, samples: int, why: str = '') -> Optional[str]:
    """The warning where ``layers`` BatchNorm layers that train normalise over ``samples`` per
    device (or per micro-batch), below :data:`BN_MIN_BATCH`; None where they do not (or there
    are none). ``why``: what set that number (the batch finder, a micro-batch split).

    >>> batchnorm_warning(20, 4, 'the batch finder chose per-device batch 4')[:60]
    'BatchNorm: 20 layer(s) that train normalise over 4 sample(s) '
    >>> batchnorm_warning(20, 8) is None and batchnorm_warning(0, 1) is None
    True
    """
    if not layers or samples >= BN_MIN_BATCH:
        return None
    return (f'BatchNorm: {layers} layer(s) that train normalise over {samples} sample(s) each '
            f'step, below {BN_MIN_BATCH}: their batch statistics are noisy and accuracy can '
            f'drop{f" ({why})" if why else ""}; {BN_FIX}')
