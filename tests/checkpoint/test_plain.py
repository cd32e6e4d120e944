"""``to_plain`` / ``from_plain``: what plain ``torch.load`` refuses in an MMEngine checkpoint is
stored as tensors and plain values, and comes back exactly (type, dtype, memory order, pickle
bytes)."""
import io
import pickle
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

from mmddp_ext.checkpoint import (PLAIN_KEY, STORED_DATASET_META, from_plain, load_checkpoint_file,
                                  to_plain)

ARRAYS = [
    np.array([0.026, 0.025], np.float32),
    np.arange(6, dtype=np.int32).reshape(2, 3),
    np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
    np.array([[255, 0, 0], [0, 255, 0]], np.uint8),
    np.array([1, 2], np.uint16),
    np.array([1, 2], dtype='>i4'),
    np.array([True, False]),
    np.array([1 + 2j], np.complex64),
    np.array(3.5),
    np.zeros((0, 2), np.float16),
    np.array(['nose', 'left_eye']),
    np.array([b'a', b'bc']),
]
SCALARS = [
    np.float64(0.75),
    np.float32(1.5),
    np.int64(-3),
    np.uint8(7),
    np.bool_(True),
    np.str_('person')
]


def _plain_load(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _history(values, max_length=10):
    buffer = HistoryBuffer(max_length=max_length)
    for value in values:
        buffer.update(value)
    return buffer


@pytest.mark.parametrize('value', ARRAYS + SCALARS, ids=lambda v: f'{type(v).__name__}-{v.dtype}')
def test_numpy_values_round_trip_exactly(value):
    with pytest.raises(pickle.UnpicklingError):
        _plain_load({'x': value})  # the test is meaningful: plain torch.load refuses it
    plain = _plain_load(to_plain({'x': value}))
    assert plain['x'][PLAIN_KEY].startswith('numpy.')
    back = from_plain(plain)['x']
    assert type(back) is type(value) and back.dtype == value.dtype
    assert pickle.dumps(back) == pickle.dumps(value)


def test_history_buffer_round_trips_with_its_values_counts_and_length():
    buffer = _history([1, 2.5, 3, 4], max_length=3)
    buffer.update(5.0, count=2)
    plain = _plain_load(to_plain({'loss': buffer}))
    back = from_plain(plain)['loss']
    assert type(back) is HistoryBuffer and back.max_length == 3
    for now, then in zip(back.data, buffer.data):
        assert now.dtype == then.dtype
        np.testing.assert_array_equal(now, then)
    assert back.mean() == buffer.mean() and back.statistics('current') == 5.0


def test_a_whole_mmengine_checkpoint_loads_plainly_and_comes_back():
    state_dict = OrderedDict(weight=torch.ones(2))
    state_dict._metadata = OrderedDict({'': {'version': 1}})
    checkpoint = {
        'meta': {
            'epoch': 2,
            'dataset_meta': {
                'sigmas': ARRAYS[0],
                'classes': ('person', )
            }
        },
        'state_dict': state_dict,
        'message_hub': {
            'log_scalars': OrderedDict({'train/loss': _history([0.5, 0.25])}),
            'runtime_info': OrderedDict(best_score=np.float64(0.7), iter=11),
            'resumed_keys': OrderedDict(best_score=True)
        },
        'optimizer': {
            'state': {},
            'param_groups': [{
                'lr': 0.1,
                'params': [0]
            }]
        },
    }
    back = from_plain(_plain_load(to_plain(checkpoint)))
    assert pickle.dumps(back['meta']) == pickle.dumps(checkpoint['meta'])
    assert pickle.dumps(back['message_hub']['runtime_info']) == \
        pickle.dumps(checkpoint['message_hub']['runtime_info'])
    assert type(back['message_hub']['log_scalars']) is OrderedDict
    np.testing.assert_array_equal(back['message_hub']['log_scalars']['train/loss'].data[0],
                                  [0.5, 0.25])
    assert back['state_dict']._metadata == state_dict._metadata


def test_input_is_not_changed_and_untouched_parts_are_not_copied():
    state_dict = OrderedDict(weight=torch.ones(2))
    meta = {'best': np.float64(0.5)}
    checkpoint = {'meta': meta, 'state_dict': state_dict}
    plain = to_plain(checkpoint)
    assert type(checkpoint['meta']['best']) is np.float64  # input unchanged
    assert plain['state_dict'] is state_dict
    assert plain['meta'] is not meta
    assert to_plain(plain) is plain and from_plain(state_dict) is state_dict


def test_what_cannot_be_made_plain_is_left_as_it_is():
    objects = np.array([{'a': 1}, None], dtype=object)
    dates = np.array(['2024-01-01'], dtype='datetime64[D]')
    plain = to_plain({'objects': objects, 'dates': dates})
    assert plain['objects'] is objects and plain['dates'] is dates


def test_the_checkpoint_loader_gives_the_objects_back(tmp_path):
    # MMEngine's load_checkpoint (MMPose's init_model reads meta.dataset_meta through it)
    path = str(tmp_path / 'plain.pth')
    torch.save(
        to_plain({
            'meta': {
                'dataset_meta': {
                    'sigmas': ARRAYS[0]
                }
            },
            'state_dict': {
                'w': torch.ones(1)
            }
        }), path)
    for loaded in (load_checkpoint_file(path), CheckpointLoader.load_checkpoint(path)):
        sigmas = loaded['meta']['dataset_meta']['sigmas']
        assert type(sigmas) is np.ndarray and sigmas.dtype == np.float32
        np.testing.assert_array_equal(sigmas, ARRAYS[0])


def test_mmengine_format_with_text_arrays_loads_through_the_allowlist(tmp_path):
    path = str(tmp_path / 'old.pth')
    torch.save({'meta': {'dataset_meta': {'names': ARRAYS[-2]}}}, path)
    loaded = load_checkpoint_file(path)
    np.testing.assert_array_equal(loaded['meta']['dataset_meta']['names'], ARRAYS[-2])


def test_a_dataset_meta_with_numpy_values_is_stored_where_stock_readers_do_not_look():
    """MMPose's ``init_model`` takes ``meta.dataset_meta`` as it finds it: marked dicts there
    would stand where its visualizer needs arrays. Stored aside, a reader without mmddp_ext
    finds none (and MMPose takes the config's); ours puts it back, in its place."""
    pose = {'sigmas': ARRAYS[0], 'keypoint_colors': ARRAYS[3], 'num_keypoints': 2}
    checkpoint = {'meta': {'dataset_meta': pose, 'epoch': 2}, 'state_dict': {}}
    stored = _plain_load(to_plain(checkpoint))
    assert 'dataset_meta' not in stored['meta'], stored['meta']
    assert stored['meta'][STORED_DATASET_META]['sigmas'][PLAIN_KEY] == 'numpy.ndarray'
    back = from_plain(stored)
    assert list(back['meta']) == ['dataset_meta', 'epoch']
    assert pickle.dumps(back['meta']) == pickle.dumps(checkpoint['meta'])
    assert from_plain(back) is back


def test_a_dataset_meta_that_is_plain_already_stays_where_mmengine_put_it():
    det = {'classes': ('person', 'dog'), 'palette': [(220, 20, 60), (0, 0, 142)]}
    checkpoint = {'meta': {'dataset_meta': det, 'best': np.float64(0.5)}}
    stored = _plain_load(to_plain(checkpoint))
    assert stored['meta']['dataset_meta'] == det  # what MMDetection's init_detector reads
    assert STORED_DATASET_META not in stored['meta']
