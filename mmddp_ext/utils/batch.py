"""Collated batches cut into micro-batches (for :class:`~mmddp_ext.ddp.microbatch.MicrobatchDDP`).

Pure functions over what MMEngine's collate functions produce: ``pseudo_collate``'s dict of
sample lists, ``default_collate``'s stacked tensors, or a mix.
"""
from typing import Any, List, Mapping, Optional


def micro_batch_sizes(batch: int, parts: int) -> List[int]:
    """Split ``batch`` samples into ``min(parts, batch)`` micro-batches as even as possible,
    larger ones first: ``micro_batch_sizes(10, 4) == [3, 3, 2, 2]``."""
    if batch < 1 or parts < 1:
        raise ValueError(f'batch={batch!r} and parts={parts!r} must be positive ints')
    parts = min(parts, batch)
    size, extra = divmod(batch, parts)
    return [size + 1] * extra + [size] * (parts - extra)


def batch_length(data: Any) -> Optional[int]:
    """The number of samples in a collated batch: the length of its first sequence or tensor
    (``{'inputs': [...], 'data_samples': [...]}`` from ``pseudo_collate``, or stacked tensors
    from ``default_collate``); None when there is none."""
    if isinstance(data, Mapping):
        for value in data.values():
            length = batch_length(value)
            if length is not None:
                return length
        return None
    if isinstance(data, (str, bytes)):
        return None
    if isinstance(data, (list, tuple)) or hasattr(data, 'shape'):
        return len(data)
    return None


def slice_batch(data: Any, start: int, stop: int, length: int) -> Any:
    """Samples ``start:stop`` of a collated batch of ``length`` samples: every sequence or
    tensor of that length is sliced, everything else is kept as it is."""
    if isinstance(data, Mapping):
        return type(data)((k, slice_batch(v, start, stop, length)) for k, v in data.items())
    if isinstance(data, (str, bytes)):
        return data
    if (isinstance(data, (list, tuple)) or hasattr(data, 'shape')) and len(data) == length:
        return data[start:stop]
    return data


def split_batch(data: Any, parts: int) -> List[Any]:
    """A collated batch as ``parts`` micro-batches (see :func:`micro_batch_sizes`).

    Raises:
        ValueError: when the batch holds no sequence or tensor to split.
    """
    length = batch_length(data)
    if length is None:
        raise ValueError(f'cannot split a batch of type {type(data).__name__} into '
                         f'micro-batches: expected a dict of sequences or tensors')
    out, start = [], 0
    for size in micro_batch_sizes(length, parts):
        out.append(slice_batch(data, start, start + size, length))
        start += size
    return out


def forward_loss(model: Any, data: Any) -> Any:
    """The losses of an MMEngine model on a preprocessed batch (what its ``train_step``
    parses), called as MMEngine calls it: keyword arguments for a dict, positional ones for a
    list or tuple."""
    if isinstance(data, dict):
        return model(**data, mode='loss')
    if isinstance(data, (list, tuple)):
        return model(*data, mode='loss')
    raise TypeError(f'a preprocessed batch must be a dict, list or tuple, not '
                    f'{type(data).__name__}')


def describe_batch(data: Any) -> Optional[dict]:
    """What made a batch heavy, from its data samples' metainfo (MMDetection's and MMPose's):
    ``{'samples': [image id or path, ...], 'shape': [height, width] (the largest after the
    pipeline), 'objects': the most ground-truth instances in one sample}``; None where the
    batch carries no data samples."""
    samples = data.get('data_samples') if isinstance(data, Mapping) else None
    if not samples or not any(getattr(s, 'metainfo', None) for s in samples):
        return None
    ids, heights, widths, objects = [], [0], [0], [0]
    for sample in samples:
        meta = getattr(sample, 'metainfo', {}) or {}
        ids.append(meta.get('img_id', meta.get('img_path', '?')))
        shape = meta.get('img_shape') or meta.get('input_size')
        if shape is not None and len(shape) >= 2:
            heights.append(int(shape[0]))
            widths.append(int(shape[1]))
        instances = getattr(sample, 'gt_instances', None)
        objects.append(len(instances) if instances is not None else 0)
    return dict(samples=ids, shape=[max(heights), max(widths)], objects=max(objects))


def batch_text(described: Optional[dict]) -> str:
    """``4 samples up to 384×384, 31 objects (img_id 12, 40, 7, 3)`` for the log; '' for None."""
    if not described:
        return ''
    ids = described['samples']
    shown = ', '.join(str(i) for i in ids[:6]) + (', …' if len(ids) > 6 else '')
    height, width = described['shape']
    return (f'{len(ids)} samples up to {width}×{height}, {described["objects"]} objects '
            f'(images {shown})')
