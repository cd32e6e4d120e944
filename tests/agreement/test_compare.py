"""The start-of-run agreement, pure: summaries in, differences and the one screen out."""
import pickle

import pytest

from mmddp_ext.agreement.compare import (PER_NODE_KEYS, PER_RANK_KEYS, RanksDisagreeError,
                                         canonical, digest, disagreements, first_param_differences,
                                         format_screen, rank_summary, short_message)

PARAMS = [('backbone.conv1.weight', (64, 3, 7, 7)), ('head.final_layer.weight', (17, 32, 1, 1)),
          ('head.final_layer.bias', (17, ))]
CFG = dict(
    model=dict(type='TopdownPoseEstimator', backbone=dict(depth=18)),
    train_dataloader=dict(batch_size=16, dataset=dict(data_root='data/demo/')),
    work_dir='work_dirs/demo', optim_wrapper=dict(optimizer=dict(lr=1e-3)))
VERSIONS = dict(torch='2.14.1', mmengine='0.10.7', mmcv='2.1.0', mmpose='1.3.2', mmdet='3.3.0',
                mmddp_ext='0.1.0')


def _summary(rank, length=320, params=PARAMS, cfg=CFG, versions=VERSIONS):
    return rank_summary(length, length // 32, params, canonical(cfg), versions, f'node{rank // 8}')


def _world(n, odd=None):
    """``n`` healthy summaries; ``odd={rank: kwargs}`` changes some ranks."""
    odd = odd or {}
    return [_summary(r, **odd.get(r, {})) for r in range(n)]


def test_healthy_ranks_agree():
    assert disagreements(_world(16)) == []


def test_a_rank_that_starts_at_another_step_is_named_with_the_fix():
    world = [
        rank_summary(320, 10, PARAMS, canonical(CFG), VERSIONS, f'node{r // 2}',
                     'epoch 1, iteration 10' if r < 2 else 'epoch 0, iteration 0') for r in range(4)
    ]
    found = disagreements(world)
    assert [d.field for d in found] == ['starts at']
    screen = format_screen(found, world)
    assert 'epoch 0, iteration 0' in screen and 'ranks 2, 3' in screen
    assert 'a work dir every node sees' in ' '.join(screen.split())


def test_host_is_carried_but_not_compared():
    world = _world(16)
    assert {s['host'] for s in world} == {'node0', 'node1'}
    assert disagreements(world) == []


@pytest.mark.parametrize('key', sorted(PER_NODE_KEYS))
def test_per_node_paths_do_not_change_the_config_digest(key):
    other = dict(CFG, train_dataloader=dict(CFG['train_dataloader'], dataset={key: '/node2/x'}),
                 **{key: '/elsewhere/'})
    assert digest(canonical(other)) == digest(
        canonical(dict(CFG, train_dataloader=dict(CFG['train_dataloader'], dataset={}))))


def _set(cfg, path, value):
    out = dict(cfg)
    head, _, rest = path.partition('.')
    out[head] = _set(out.get(head, {}), rest, value) if rest else value
    return out


# What a launcher, MMEngine or we set per rank or per node, as it reaches a rank's config:
# none of it may change what the ranks compare. (path, local rank 0's value, local rank 1's)
PER_RANK_VALUES = [
    ('model_wrapper_cfg.device_ids', [0], [1]),  # DDP's device (MMEngine: [LOCAL_RANK])
    ('model_wrapper_cfg.output_device', 0, 1),
    ('gpu_ids', [0], [1]),  # MMDetection 2's per-rank GPU list, kept by old configs
    ('local_rank', 0, 1),  # argparse's --local_rank copied into a config
    ('work_dir', 'work_dirs/demo/20261203_101010', 'work_dirs/demo/20261203_101011'),  # stamped
    ('launcher', 'pytorch', 'slurm'),  # torchrun and srun ranks of one job
    ('load_from', '/node0/ckpt.pth', '/node1/ckpt.pth'),  # each node's own copy
    ('train_dataloader.dataset.data_root', '/node0/data', '/node1/data'),
]


@pytest.mark.parametrize('path, rank0, rank1', PER_RANK_VALUES)
def test_what_differs_per_rank_or_node_is_not_compared(path, rank0, rank1):
    assert digest(canonical(_set(CFG, path, rank0))) == digest(canonical(_set(CFG, path, rank1)))


def test_the_per_rank_table_covers_every_excluded_device_key():
    listed = {path.split('.')[-1] for path, _, _ in PER_RANK_VALUES}
    assert PER_RANK_KEYS <= listed


def test_what_the_user_wrote_is_still_compared():
    changed = _set(CFG, 'model_wrapper_cfg.find_unused_parameters', True)
    assert digest(canonical(changed)) != digest(canonical(CFG))


def test_canonical_drops_memory_addresses_and_names_functions():

    class Thing:
        pass

    a, b = canonical({'f': len, 'cls': Thing, 'obj': Thing()}), canonical({'obj': Thing()})
    assert a['f'] == 'builtins.len' and a['cls'].endswith('Thing')
    assert a['obj'] == b['obj'] and '0x' not in a['obj']


def test_dataset_length_mismatch_names_rank_field_values_and_fix():
    world = _world(2, {1: dict(length=288)})
    found = disagreements(world)
    assert [d.field for d in found] == ['dataset length', 'iterations per epoch']
    assert found[0].groups == ((320, (0, )), (288, (1, )))
    screen = format_screen(found, world)
    assert ' '.join(screen.splitlines()[:2]).replace('   ', ' ') == (
        'ranks disagree before the first iteration, stopping every rank: rank 1 of 2 differs in '
        'dataset length, iterations per epoch')
    assert '320' in screen and '288' in screen and 'rank 1 (host node0)' in screen
    assert 'fix: every rank must read the same annotation file' in screen


def test_model_mismatch_shows_first_differing_parameters():
    other = PARAMS[:1] + [('head.final_layer.weight', (16, 32, 1, 1)),
                          ('head.final_layer.bias', (16, ))]
    world = _world(4, {3: dict(params=other)})
    found = disagreements(world)
    assert [d.field for d in found] == ['parameters']
    screen = format_screen(found, world, {0: PARAMS, 3: other})
    assert 'first differences, rank 0 vs rank 3:' in screen
    assert 'head.final_layer.weight: (17, 32, 1, 1) vs (16, 32, 1, 1)' in screen
    assert 'head.final_layer.bias: (17) vs (16)' in screen
    assert 'fix: every rank must build the same model' in screen


def test_first_param_differences_names_missing_parameters():
    lines = first_param_differences(PARAMS, PARAMS[:2] + [('extra.weight', (2, ))])
    assert lines == ['head.final_layer.bias: (17) vs missing', 'extra.weight: missing vs (2)']


def test_config_mismatch_names_the_section():
    other = dict(CFG, optim_wrapper=dict(optimizer=dict(lr=2e-3)))
    world = _world(2, {1: dict(cfg=other)})
    found = disagreements(world)
    assert [d.field for d in found] == ['config']
    screen = format_screen(found, world)
    assert 'sections that differ, rank 0 vs rank 1: optim_wrapper' in screen
    assert 'same --cfg-options' in screen


def test_version_mismatch_says_what_to_install():
    world = _world(8, {r: dict(versions=dict(VERSIONS, mmcv='2.0.1')) for r in (5, 6)})
    found = disagreements(world)
    assert [d.field for d in found] == ['version mmcv']
    screen = format_screen(found, world)
    assert '2.0.1' in screen and 'ranks 5, 6' in screen
    assert 'pip install mmcv==2.1.0' in screen


def test_1024_ranks_stay_one_screen():
    """Two nodes' worth of odd ranks, three odd values, 1024 ranks: grouped, one screen."""
    odd = {r: dict(length=288) for r in range(512, 520)}
    odd.update({733: dict(length=100), 901: dict(versions=dict(VERSIONS, torch='2.13.0'))})
    world = _world(1024, odd)
    found = disagreements(world)
    screen = format_screen(found, world)
    lines = screen.splitlines()
    assert len(lines) <= 25, screen
    assert 'rank: ranks 512-519, 733, 901 of 1024' in lines[0]
    assert lines[1].startswith('  differ in dataset length')
    assert 'ranks 0-511, 520-732, 734-1023' in screen  # the agreeing ranks, grouped
    assert 'ranks 512-519 (host node64)' in screen and 'rank 733 (host node91)' in screen
    assert 'rank 901 (host node112)' in screen and '2.13.0' in screen
    assert max(len(line) for line in lines) <= 100


def test_many_odd_values_are_counted_not_listed():
    world = _world(1024, {r: dict(length=1000 + r) for r in range(0, 1024, 2)})
    found = disagreements(world)
    screen = format_screen(found, world)
    assert len(screen.splitlines()) <= 25
    assert '... 509 more values on ranks' in screen


def test_short_message_and_error_pickle():
    world = _world(2, {1: dict(length=288)})
    found = disagreements(world)
    msg = short_message(found, 2)
    assert "rank 1 of 2 differs in dataset length, iterations per epoch; the table is in rank 0's" \
        in msg
    err = pickle.loads(pickle.dumps(RanksDisagreeError(msg, ['dataset length'], [1])))
    assert str(err) == msg and err.fields == ['dataset length'] and err.ranks == [1]
