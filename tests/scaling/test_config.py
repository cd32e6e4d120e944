"""Tests for :mod:`mmddp_ext.scaling.config`: parsing and validating the ``scaling`` block."""
import ast
import os.path as osp
import re
from collections import OrderedDict

import pytest

from mmddp_ext.scaling.config import SCALING_KEYS, ScalingConfig, check_runtime, parse_scaling

SCALING_DIR = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'mmddp_ext', 'scaling')


@pytest.mark.parametrize('block', [None, {}, OrderedDict()])
def test_empty_block_gives_defaults(block):
    cfg = parse_scaling(block)
    assert cfg == ScalingConfig()
    assert (cfg.global_batch_size, cfg.max_batch_per_device, cfg.base_batch_size) == (None, None,
                                                                                      None)
    assert (cfg.lr_rule, cfg.schedule) == ('linear', 'keep_samples')


@pytest.mark.parametrize('block, expected', [
    (dict(global_batch_size=512, max_batch_per_device=64, base_batch_size=256, lr_rule='sqrt',
          schedule='keep_iters'), ScalingConfig(512, 64, 256, 'sqrt', 'keep_iters')),
    (dict(max_batch_per_device='auto'), ScalingConfig(max_batch_per_device='auto')),
    (dict(lr_rule='none', global_batch_size=1), ScalingConfig(global_batch_size=1, lr_rule='none')),
    (dict(global_batch_size=None), ScalingConfig()),
])
def test_valid_block(block, expected):
    assert parse_scaling(block) == expected


def test_accepts_dict_subclass():

    class ConfigDictLike(dict):
        pass

    cfg = parse_scaling(ConfigDictLike(global_batch_size=128))
    assert cfg.global_batch_size == 128


def test_result_is_frozen():
    cfg = parse_scaling(dict(global_batch_size=8))
    with pytest.raises(Exception):
        cfg.global_batch_size = 16  # type: ignore[misc]


def _documented_block():
    """The ``scaling`` block as docs/scaling.md shows it (keys in its order, with the values it
    gives as defaults)."""
    text = open(osp.join(SCALING_DIR, '..', '..', 'docs', 'scaling.md')).read()
    start = text.index('scaling = dict(\n')
    source = text[start:text.index('\n)', start) + 2]
    call = ast.parse(source).body[0].value
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def _documented_keys():
    return list(_documented_block())


def test_the_documented_block_is_the_accepted_one_with_its_defaults():
    assert _documented_keys() == list(SCALING_KEYS)
    assert parse_scaling(_documented_block()) == ScalingConfig()  # the defaults it states


@pytest.mark.parametrize('key, suggestion', [
    ('global_batch', 'global_batch_size'),
    ('max_batch_per_gpu', 'max_batch_per_device'),
    ('lr_rules', 'lr_rule'),
    ('schedul', 'schedule'),
])
def test_unknown_key_did_you_mean(key, suggestion):
    with pytest.raises(ValueError) as info:
        parse_scaling({key: 1})
    msg = str(info.value)
    assert f'unknown key scaling.{key}' in msg
    assert f'did you mean {suggestion!r}?' in msg
    assert 'Valid keys: ' + ', '.join(_documented_keys()) in msg


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(ValueError, match=r"unknown key scaling\.zzz 'zzz'\. Valid keys: "
                       r'global_batch_size') as info:
        parse_scaling(dict(zzz=1))
    assert 'did you mean' not in str(info.value)


SIZE_KEYS = ('global_batch_size', 'max_batch_per_device', 'base_batch_size')
BAD_SIZES = [0, -1, 2.5, 64.0, True, False, '64', [64]]


@pytest.mark.parametrize('key', SIZE_KEYS)
@pytest.mark.parametrize('value', BAD_SIZES)
def test_bad_size_names_key_and_value(key, value):
    with pytest.raises(ValueError, match=re.escape(f'scaling.{key}={value!r}')) as info:
        parse_scaling({key: value})
    assert 'must be a positive int' in str(info.value)


@pytest.mark.parametrize('value, fix', [
    (64.0, 'use 64 (scaling.global_batch_size=64'),
    ('64', 'use 64 (scaling.global_batch_size=64'),
    (2.5, 'e.g. scaling.global_batch_size=64'),
])
def test_bad_size_suggests_fix(value, fix):
    with pytest.raises(ValueError, match=re.escape(fix)):
        parse_scaling(dict(global_batch_size=value))


@pytest.mark.parametrize('value', ['Auto', 'max', ''])
def test_max_batch_per_device_only_accepts_auto_string(value):
    with pytest.raises(
            ValueError, match=re.escape(
                f"scaling.max_batch_per_device={value!r} (str) must be a positive int or 'auto'")):
        parse_scaling(dict(max_batch_per_device=value))


@pytest.mark.parametrize('key, value, allowed', [
    ('lr_rule', 'cubic', "'linear', 'sqrt', 'none'"),
    ('lr_rule', None, "'linear', 'sqrt', 'none'"),
    ('lr_rule', 1, "'linear', 'sqrt', 'none'"),
    ('schedule', 'x', "'keep_samples', 'keep_iters'"),
    ('schedule', 'keep_iter', "'keep_samples', 'keep_iters'"),
    ('on_oom', 'micro_batch', "'raise', 'microbatch'"),
    ('on_oom', True, "'raise', 'microbatch'"),
])
def test_bad_choice_lists_allowed(key, value, allowed):
    with pytest.raises(ValueError, match=re.escape(f'scaling.{key}={value!r}')) as info:
        parse_scaling({key: value})
    assert allowed in str(info.value)


def test_bad_choice_did_you_mean():
    with pytest.raises(ValueError, match=r"did you mean 'keep_iters'\?"):
        parse_scaling(dict(schedule='keep_iter'))


def test_direct_construction_is_validated():
    with pytest.raises(ValueError, match=r'scaling\.base_batch_size=0'):
        ScalingConfig(base_batch_size=0)


@pytest.mark.parametrize('block', [[('global_batch_size', 8)], 'global_batch_size=8', 8])
def test_non_mapping_block(block):
    with pytest.raises(ValueError, match=re.escape(f'scaling={block!r}')):
        parse_scaling(block)


def test_oom_keys_parse_and_validate():
    cfg = parse_scaling(
        dict(max_batch_per_device='auto', memory_budget_mib=2048, on_oom='microbatch'))
    assert cfg.probe and cfg.memory_budget_mib == 2048 and cfg.on_oom == 'microbatch'
    assert not parse_scaling(dict(max_batch_per_device=8)).probe
    with pytest.raises(ValueError, match=r"scaling\.memory_budget_mib='4G' .*positive int"):
        parse_scaling(dict(memory_budget_mib='4G'))
    with pytest.raises(ValueError, match=r"did you mean 'microbatch'\?"):
        parse_scaling(dict(on_oom='micro_batch'))


@pytest.mark.parametrize(
    'block, policy',
    [
        ({}, 'raise'),
        (dict(max_batch_per_device='auto'), 'microbatch'),  # a found batch is guarded
        (dict(max_batch_per_device='auto', on_oom='raise'), 'raise'),  # unless told otherwise
        (dict(max_batch_per_device=8, on_oom='microbatch'), 'microbatch'),
        (dict(on_oom=None), 'raise'),
    ])
def test_oom_policy_defaults_to_guarding_a_measured_batch(block, policy):
    assert parse_scaling(block).oom_policy == policy


@pytest.mark.parametrize('block, cuda, distributed, message', [
    (dict(max_batch_per_device='auto'), False, True, 'scaling.memory_budget_mib=4096'),
    (dict(max_batch_per_device='auto'), False, False, 'scaling.memory_budget_mib=4096'),
])
def test_runtime_check_names_the_fix(block, cuda, distributed, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_runtime(parse_scaling(block), cuda, distributed)


@pytest.mark.parametrize(
    'block, cuda, distributed',
    [
        (dict(max_batch_per_device='auto'), True, True),  # a GPU measures its own memory
        (dict(max_batch_per_device='auto', memory_budget_mib=512), False, False),
        (dict(on_oom='microbatch'), False, True),
        (dict(on_oom='microbatch'), True, False),  # guarded in one process too
        ({}, False, False),
    ])
def test_runtime_check_accepts(block, cuda, distributed):
    """The control of test_runtime_check_names_the_fix: each case is one condition away from
    a refused one ('auto' with a GPU, or with a budget, instead of neither), and passes."""
    assert check_runtime(parse_scaling(block), cuda, distributed) is None
    if block.get('max_batch_per_device') == 'auto':
        refused = {k: v for k, v in block.items() if k != 'memory_budget_mib'}
        with pytest.raises(ValueError, match='needs a memory budget'):
            check_runtime(parse_scaling(refused), False, distributed)


@pytest.mark.parametrize(
    'module', ['__init__.py', 'config.py', 'plan.py',
               osp.join('..', 'batch_finder', 'search.py')])
def test_pure_stdlib_imports(module):
    with open(osp.join(SCALING_DIR, module), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split('.')[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split('.')[0])
    allowed = {
        'dataclasses', 'math', 'difflib', 're', 'typing', 'itertools', 'hashlib', 'json', 'time'
    }
    assert roots <= allowed, roots - allowed
