"""Test-only, imported through ``custom_imports``: an out-of-memory error injected into
training on one rank, deterministically.

``InjectOOMHook(rank=1, above=8)`` makes the training model of ``rank`` raise the CPU
allocator's real error (the text torch raises under an address-space limit) whenever a
forward pass gets more than ``above`` samples. It is installed in ``before_train``, after the
batch finder ran on a model of its own: the finder sees no failure, training does -- the
"it fitted in the trial, then training ran out of memory" case, on any machine.
"""
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

MESSAGE = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
           "memory: you tried to allocate {} bytes. Error code 12 (Cannot allocate memory)")


@HOOKS.register_module()
class InjectOOMHook(Hook):
    """Raise an out-of-memory error on ``rank`` for forward passes above ``above`` samples."""

    priority = 'VERY_LOW'

    def __init__(self, rank: int, above: int) -> None:
        self.rank, self.above = rank, above

    def before_train(self, runner) -> None:
        if runner.rank != self.rank:
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        forward, above = model.forward, self.above

        def guarded(*args, **kwargs):  # BaseModel.forward(inputs, data_samples, mode)
            inputs = kwargs.get('inputs', args[0] if args else None)
            mode = kwargs.get('mode', args[2] if len(args) > 2 else 'tensor')
            if mode == 'loss' and inputs is not None and len(inputs) > above:
                raise RuntimeError(MESSAGE.format(len(inputs) * 2**22))
            return forward(*args, **kwargs)

        model.forward = guarded  # nn.Module.__call__ calls it, under DDP and MicrobatchDDP
