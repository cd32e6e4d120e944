"""Cutting collated batches into micro-batches (pure)."""
import pytest
import torch

from mmddp_ext.utils.batch import batch_length, micro_batch_sizes, split_batch


@pytest.mark.parametrize('batch, parts, sizes', [(10, 4, [3, 3, 2, 2]), (16, 2, [8, 8]),
                                                 (3, 8, [1, 1, 1]), (1, 1, [1]), (7, 1, [7])])
def test_micro_batch_sizes(batch, parts, sizes):
    assert micro_batch_sizes(batch, parts) == sizes and sum(sizes) == batch


def test_split_batch_slices_sample_lists_and_tensors_alike():
    pseudo = dict(inputs=[torch.full((3, 2, 2), i) for i in range(5)],
                  data_samples=[f's{i}' for i in range(5)], meta='kept')
    parts = split_batch(pseudo, 2)
    assert [batch_length(p) for p in parts] == [3, 2]
    assert parts[1]['data_samples'] == ['s3', 's4'] and parts[1]['meta'] == 'kept'
    stacked = dict(inputs=torch.arange(10).reshape(5, 2), data_samples=list('abcde'))
    first, second = split_batch(stacked, 2)
    assert first['inputs'].tolist() == [[0, 1], [2, 3], [4, 5]
                                        ] and second['data_samples'] == ['d', 'e']
    with pytest.raises(ValueError, match='cannot split a batch of type int'):
        split_batch(3, 2)


def test_a_batch_is_described_by_its_largest_image_and_most_objects():
    import torch
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData

    from mmddp_ext.utils.batch import batch_text, describe_batch
    samples = []
    for img_id, shape, objects in ((12, (384, 384), 31), (40, (128, 96), 2)):
        sample = DetDataSample(metainfo=dict(img_id=img_id, img_shape=shape))
        sample.gt_instances = InstanceData(bboxes=torch.zeros(objects, 4))
        samples.append(sample)
    described = describe_batch(dict(inputs=[None, None], data_samples=samples))
    assert described == dict(samples=[12, 40], shape=[384, 384], objects=31)
    assert batch_text(described) == '2 samples up to 384×384, 31 objects (images 12, 40)'
    assert describe_batch(dict(inputs=[1], data_samples=[torch.zeros(1)])) is None
    assert batch_text(None) == ''
