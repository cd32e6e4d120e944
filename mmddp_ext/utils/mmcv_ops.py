"""Whether the installed mmcv has its compiled ops for the GPU a config would train on.

``tools/install.sh`` builds mmcv's ops for the CPU unless ``nvcc`` is on PATH, and most GPU
machines with pip's torch have a driver but no CUDA toolkit. MMDetection's losses and
post-processing then call ``mmcv.ops`` on CUDA tensors (``sigmoid_focal_loss``, ``nms``,
``roi_align``) and the first iteration fails; MMPose's top-down recipes call none.
"""
from typing import Any, Optional

# scopes whose models call mmcv's compiled ops in training or validation
OPS_SCOPES = frozenset({'mmdet', 'mmrotate', 'mmocr', 'mmseg', 'mmtrack', 'mmdet3d'})
FIX = ('rebuild mmcv with CUDA ops: put the CUDA toolkit on PATH (nvcc), pip uninstall -y mmcv, '
       'then bash tools/install.sh')


def ops_for_cpu_only() -> bool:
    """True when mmcv's compiled ops are installed and were built without CUDA."""
    try:
        from mmcv.ops import get_compiling_cuda_version  # here: compiled ops are optional
    except ImportError:  # no compiled ops at all: the import of the model says so itself
        return False
    return get_compiling_cuda_version() == 'not available'


def missing_gpu_ops(cfg: Any, on_gpu: bool, cpu_only: Optional[bool] = None) -> Optional[str]:
    """One line when ``cfg`` trains on a GPU (``on_gpu``) with a model of a scope that calls
    mmcv's compiled ops (:data:`OPS_SCOPES`) and the installed ops are for the CPU only
    (``cpu_only``, default: :func:`ops_for_cpu_only`); else None."""
    scope = cfg.get('default_scope')
    if not on_gpu or scope not in OPS_SCOPES:
        return None
    if not (ops_for_cpu_only() if cpu_only is None else cpu_only):
        return None
    return (f"default_scope={scope!r} calls mmcv's compiled ops on CUDA tensors (e.g. "
            "sigmoid_focal_loss, nms), but the installed mmcv has them for the CPU only: the "
            f'first iteration on the GPU would fail. Fix: {FIX}')
