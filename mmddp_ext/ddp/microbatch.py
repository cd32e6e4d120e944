"""``MicrobatchDDP``: data parallelism whose training step survives an out-of-memory error.

Selected by ``scaling.on_oom='microbatch'``, the default with ``max_batch_per_device='auto'``
(:func:`mmddp_ext.ddp.wrapper.ddp_wrapper_cfg`). It keeps DDP's semantics without DDP's reducer
and orders each step so that the ranks agree on an out-of-memory error before any collective;
then every rank redoes the step as more, smaller micro-batches, with the same global batch and
LR. :class:`FlatGradients` holds the gradients. How a step runs, and what it costs:
docs/scaling.md, 'Surviving an out-of-memory step'.
"""
import logging
import math
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from mmengine.registry import MODEL_WRAPPERS

from ..oom.classify import is_oom_error
from ..oom.onednn import turn_off_onednn_after
from ..oom.ranks_out_of_memory import RanksOutOfMemoryError, ranks_out_of_memory
from ..oom.release import memory_reading, release_memory
from ..utils.batch import batch_length, batch_text, describe_batch, forward_loss, split_batch
from ..utils.log import log_line

CHUNK_BYTES = 25 * 2**20


class FlatGradients:
    """Every gradient as a view of one flat tensor per (device, dtype), allocated once, as
    DDP's ``gradient_as_bucket_view`` does: averaging the gradients over ranks then allocates
    nothing, so it cannot run out of memory half-way through its collectives.

    Args:
        params: The model's parameters (those without ``requires_grad`` are left alone).
    """

    def __init__(self, params) -> None:
        self.params = [p for p in params if p.requires_grad]
        groups: Dict[Any, List[torch.nn.Parameter]] = {}
        for p in self.params:
            groups.setdefault((p.device, p.dtype), []).append(p)
        self.flats: List[torch.Tensor] = []
        by_param = {}
        for (device, dtype), members in groups.items():
            flat = torch.zeros(sum(p.numel() for p in members), device=device, dtype=dtype)
            offset = 0
            for p in members:
                by_param[id(p)] = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            self.flats.append(flat)
        self.views: List[torch.Tensor] = [by_param[id(p)] for p in self.params]
        self.attach()

    def attach(self) -> None:
        """Point every gradient at its view again, keeping its value (code that set a
        gradient to None or replaced it does not take it out of the average)."""
        for p, view in zip(self.params, self.views):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            else:
                continue
            p.grad = view

    def average(self) -> None:
        """All-reduce the gradients in place, chunk by chunk, and divide by the world size.
        All ranks must call this (nothing to do in a single process)."""
        self.attach()
        world = _world_size()
        if world == 1:
            return
        for flat in self.flats:
            step = max(1, CHUNK_BYTES // flat.element_size())
            for start in range(0, flat.numel(), step):
                dist.all_reduce(flat[start:start + step])
            flat.div_(world)


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@MODEL_WRAPPERS.register_module()
class MicrobatchDDP(torch.nn.Module):
    """A data-parallel model wrapper with an out-of-memory-proof ``train_step`` (docs/scaling.md,
    'Surviving an out-of-memory step'). It takes ``MMDistributedDataParallel``'s arguments, so it
    can replace it in ``model_wrapper_cfg``; those about DDP's reducer (buckets, device ids, unused
    parameters: every parameter's gradient is averaged, absent ones as zeros) do not apply.

    Args:
        module: The model (an MMEngine ``BaseModel``).
        broadcast_buffers: Broadcast the buffers from rank 0 before each optimizer step.

    Attributes:
        micro_batches: Micro-batches per batch (1 until an out-of-memory error).
        redone: How many times a step was redone.
        failed_batch: What made the last batch that ran out of memory heavy
            (:func:`~mmddp_ext.utils.batch.describe_batch`), or None.
        failed_micro_batch: The size of the micro-batch (or batch) that last ran out of
            memory on some rank; None while nothing did.
        phase: The part of the step running now (``'backward of micro-batch 2/4'``), named
            in the debug line after an out-of-memory error (``log_level='DEBUG'``).
    """

    def __init__(self, module: torch.nn.Module, broadcast_buffers: bool = False,
                 **ddp_args: Any) -> None:
        super().__init__()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        if _world_size() > 1:  # as DDP does at construction: every replica starts equal
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor.data, 0)
        self.grads = FlatGradients(self.module.parameters())
        self.micro_batches = 1
        self.redone = 0
        self.failed_micro_batch: Optional[int] = None
        self.failed_batch: Optional[dict] = None
        self.phase = ''  # the part of the step running now, for the debug log
        self._pending: List[tuple] = []  # (batch, loss weight) of the current cycle
        self._done = 0  # pending batches whose gradients are in place
        self._saved_buffers: Optional[List[torch.Tensor]] = None

    def _backward(self, loss: torch.Tensor, optim_wrapper, count: bool) -> None:
        """Backward; only the last micro-batch of the current iteration goes through
        ``optim_wrapper.backward``, which counts the iteration for gradient accumulation."""
        if count:
            optim_wrapper.backward(loss)
            return
        scaler = getattr(optim_wrapper, 'loss_scaler', None)  # AmpOptimWrapper
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def _run(self, optim_wrapper) -> Dict[str, torch.Tensor]:
        """Forward + backward of every pending batch in micro-batches; the log variables of
        the current (last) batch."""
        log_vars: Dict[str, torch.Tensor] = {}
        for index, (batch, weight) in enumerate(self._pending):
            if index < self._done:
                continue  # its gradients are in place already
            length = batch_length(batch) or 1
            parts = split_batch(batch, self.micro_batches) if self.micro_batches > 1 else [batch]
            for number, part in enumerate(parts):
                share = (batch_length(part) or length) / length
                self.phase = f'forward of micro-batch {number + 1}/{len(parts)}'
                with optim_wrapper.optim_context(self):
                    data = self.module.data_preprocessor(part, training=True)
                    losses = forward_loss(self.module, data)
                loss, part_vars = self.module.parse_losses(losses)
                last = index == len(self._pending) - 1 and number == len(parts) - 1
                self.phase = f'backward of micro-batch {number + 1}/{len(parts)}'
                self._backward(loss * (share * weight), optim_wrapper, count=last)
                if index == len(self._pending) - 1:
                    for key, value in part_vars.items():
                        log_vars[key] = log_vars.get(key, 0) + value * share
                del data, losses, loss
        return log_vars

    def _sync_and_step(self, optim_wrapper) -> None:
        """Average the gradients over ranks and step. The average allocates nothing; an
        out-of-memory error in the step (e.g. the optimizer's state, allocated at the first
        step) is agreed on and stops every rank."""
        self.grads.average()
        if self.broadcast_buffers and _world_size() > 1:
            for buffer in self.module.buffers():
                dist.broadcast(buffer, 0)
        error = None
        try:
            optim_wrapper.step()
        except Exception as e:  # noqa: B902 - only out-of-memory errors are agreed on
            if not is_oom_error(e):
                raise
            error = e
        failed = ranks_out_of_memory(error is None)
        if failed:
            raise RanksOutOfMemoryError(
                f'out of memory on rank(s) {failed} in the optimizer step, after forward and '
                f'backward fitted: smaller micro-batches cannot help here; raise '
                f'scaling.memory_budget_mib or use a device with more memory '
                f'(this rank: {error or "fitted"})', failed)
        optim_wrapper.zero_grad(set_to_none=False)  # keep the gradients in the flat buffer

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The inner model's forward."""
        return self.module(*args, **kwargs)

    def val_step(self, data: Any) -> list:
        """The inner model's ``val_step``."""
        return self.module.val_step(data)

    def test_step(self, data: Any) -> list:
        """The inner model's ``test_step``."""
        return self.module.test_step(data)

    def _redo(self, failed: List[int], batch: int) -> None:
        self.failed_micro_batch = math.ceil(batch / self.micro_batches)
        self.failed_batch = describe_batch(self._pending[-1][0]) if self._pending else None
        heavy = batch_text(self.failed_batch)
        if self.micro_batches >= batch:
            raise RanksOutOfMemoryError(
                f'out of memory on rank(s) {failed} even with micro-batches of 1 sample '
                f'(per-device batch {batch}): raise scaling.memory_budget_mib, or use a device '
                f'with more memory, a smaller model or a smaller input size', failed)
        self.micro_batches *= 2
        self.redone += 1
        sizes = sorted(set(batch_length(b) or 1 for b, _ in self._pending))
        log_line(
            'on_oom=microbatch: '
            f'out of memory on rank(s) {failed} during a step'
            f'{f" (this rank: {heavy})" if heavy else ""}; every rank redoes it as '
            f'{self.micro_batches} micro-batches per batch (per-device batch '
            f'{"/".join(map(str, sizes))}) with accumulation: global batch and LR '
            f'unchanged', logging.WARNING)

    def train_step(self, data, optim_wrapper) -> Dict[str, torch.Tensor]:
        """One training iteration: forward and backward of each micro-batch with no collective,
        then one all-gather of whether any rank ran out of memory; if one did, every rank drops
        the gradients of the current accumulation cycle, restores the buffers of its start and
        redoes it with twice the micro-batches. When the optimizer is due, the gradients are
        averaged over ranks and it steps. All ranks must call this.

        Args:
            data: The batch from the dataloader (a dict of sample lists or tensors).
            optim_wrapper: The runner's optimizer wrapper (accumulation, AMP, clipping).

        Returns:
            The log variables of the batch (micro-batch values weighted by their size).
        """
        if not self._pending:
            self._saved_buffers = [b.detach().clone() for b in self.module.buffers()]
        self._pending.append((data, float(optim_wrapper.scale_loss(torch.ones(())))))
        # the iteration is counted for accumulation by its last backward; a rank that had
        # finished an attempt another rank failed must not count it twice (the ranks would
        # then step the optimizer at different iterations and wait on each other)
        counted = optim_wrapper._inner_count
        device = self.grads.flats[0].device if self.grads.flats else None
        while True:
            error, before = None, memory_reading(device)
            try:
                log_vars = self._run(optim_wrapper)
            except Exception as e:  # noqa: B902 - only out-of-memory errors are redone
                if not is_oom_error(e):
                    raise
                error = type(e).__name__
                turn_off_onednn_after(e)  # else every redone micro-batch fails in oneDNN
            failed = ranks_out_of_memory(error is None)
            if not failed:
                self._done = len(self._pending)
                break
            optim_wrapper.zero_grad(set_to_none=False)
            optim_wrapper._inner_count = counted
            self._done = 0
            release_memory(device)
            log_line(
                f'on_oom=microbatch: attempt at {self.micro_batches} micro-batch(es) per batch: '
                f'{f"out of memory here in the {self.phase}" if error else "fitted here"}; '
                f'before it: {before}; after the release: {memory_reading(device)}', logging.DEBUG)
            for saved, buffer in zip(self._saved_buffers, self.module.buffers()):
                buffer.copy_(saved)
            self._redo(failed, max(batch_length(b) or 1 for b, _ in self._pending))
        if optim_wrapper.should_update():
            self._sync_and_step(optim_wrapper)
            self._pending, self._saved_buffers, self._done = [], None, 0
        return log_vars
