"""The heaviest batch of a rank's share (``mmddp_ext/batch_finder/heaviest.py``), table-tested:
the pipeline's resize at its largest, mmcv's keep-ratio rule, the preprocessor's padding, the
sizes MMDetection's and MMPose's data infos give, and the choice itself."""
import numpy as np
import pytest

from mmddp_ext.batch_finder.heaviest import (ResizeRule, SampleSize, fixed_size, heaviest, padded,
                                             resize_rule, resized, size_of)


@pytest.mark.parametrize('pipeline, rule', [
    ([dict(type='LoadImageFromFile')], None),
    ([dict(type='Resize', scale=(1333, 800), keep_ratio=True)], ResizeRule((1333, 800), True)),
    ([dict(type='Resize', scale=640, keep_ratio=False)], ResizeRule((640, 640), False)),
    ([dict(type='RandomResize', scale=(640, 640), ratio_range=(0.1, 2.0), keep_ratio=True)
      ], ResizeRule((1280, 1280), True)),
    ([dict(type='RandomResize', scale=[(1333, 640),
                                       (1333, 800)], keep_ratio=True)], ResizeRule(
                                           (1333, 800), True)),
    ([dict(type='RandomChoiceResize', scales=[(480, 1333), (800, 1333)], keep_ratio=True)
      ], ResizeRule((800, 1333), True)),
    ([dict(type='mmdet.FixShapeResize', width=512, height=384)], ResizeRule((512, 384), False)),
])
def test_the_resize_at_its_largest(pipeline, rule):
    assert resize_rule(pipeline) == rule


def test_a_top_down_crop_has_one_size():
    assert fixed_size([dict(type='TopdownAffine', input_size=(192, 256))])
    assert not fixed_size([dict(type='Resize', scale=(1333, 800))])


@pytest.mark.parametrize(
    'hw, rule, out',
    [
        ((480, 640), ResizeRule((1333, 800), True), (800, 1067)),  # short side to 800
        ((300, 1200), ResizeRule((1333, 800), True), (333, 1333)),  # long side to 1333
        ((480, 640), ResizeRule((512, 384), False), (384, 512)),
        ((480, 640), None, (480, 640)),
    ])
def test_keep_ratio_fits_inside_the_scale_as_mmcv(hw, rule, out):
    assert resized(*hw, rule) == out


def test_padding_rounds_up_to_the_divisor():
    assert padded(800, 1067, 32) == (800, 1088) and padded(5, 7, 1) == (5, 7)


def test_sizes_from_mmdet_and_mmpose_infos():
    assert size_of(3, dict(height=480, width=640, instances=[{}, {}])) == SampleSize(3, 480, 640, 2)
    bottom_up = dict(img_shape=(256, 320), bbox=np.zeros((5, 4)))
    assert size_of(4, bottom_up) == SampleSize(4, 256, 320, 5)
    assert size_of(5, dict(bbox=np.zeros((1, 4)))) is None  # no image size: nothing to rank by


def test_the_largest_padded_images_first_then_the_most_objects():
    sizes = [
        SampleSize(0, 128, 128, 3),
        SampleSize(1, 480, 640, 1),
        SampleSize(2, 128, 128, 40),
        SampleSize(3, 600, 800, 2),
        SampleSize(4, 480, 640, 9),
    ]
    found = heaviest(sizes, 3, ResizeRule((1333, 800), True), 32, "rank 1's share")
    # 600x800 and 480x640 both resize to 800x1067 (padded 800x1088); more objects first
    assert found.indices == [4, 3, 1]
    assert found.shape == (800, 1088) and found.objects == 9
    assert found.note.startswith("the heaviest of rank 1's share (5 samples): 1088×800 padded, 9 "
                                 'objects (samples 4, ')
    unresized = heaviest(sizes, 2, None, 1, 'x')
    assert unresized.indices == [3, 4] and unresized.shape == (600, 800)


def test_one_size_and_one_count_has_nothing_to_rank():
    sizes = [SampleSize(i, 64, 64, 1) for i in range(4)]
    assert heaviest(sizes, 2, None, 32, 'x') is None


def test_a_small_share_repeats():
    sizes = [SampleSize(0, 64, 64, 1), SampleSize(1, 96, 96, 1)]
    assert heaviest(sizes, 5, None, 1, 'x').indices == [1, 0, 1, 0, 1]


def test_a_batch_pads_to_its_tallest_and_widest_unless_grouped_by_aspect():
    sizes = [SampleSize(0, 640, 240, 2), SampleSize(1, 240, 640, 5), SampleSize(2, 300, 300, 1)]
    rule = ResizeRule((1333, 800), True)
    mixed = heaviest(sizes, 2, rule, 32, 'x')
    assert mixed.shape == (1344, 1344)  # a tall and a wide image in one batch
    grouped = heaviest(sizes, 2, rule, 32, 'x', by_aspect=True)
    # the wide group (the wide image and the square one) pads to 800x1344, heavier than the
    # tall image alone (1344x512)
    assert grouped.indices == [1, 2] and grouped.shape == (800, 1344) and grouped.objects == 5
