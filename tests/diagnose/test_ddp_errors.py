"""DDP's errors in our words (:mod:`mmddp_ext.diagnose.ddp_errors`), table-tested on torch's own
messages as torch 2.14 prints them (copied from real 2-process runs of the demo)."""
import pytest

from mmddp_ext.diagnose.ddp_errors import ddp_error_lines, mismatch_text

UNUSED = ('Expected to have finished reduction in the prior iteration before starting a new '
          'one. This error indicates that your module has parameters that were not used in '
          'producing loss. ...\nParameter indices which did not receive grad for rank {r}: 2 3\n'
          ' In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either '
          'INFO or DETAIL ...')
TWICE = ('Expected to mark a variable ready only once. This error is caused by one of the '
         'following reasons: ...\nParameter at index 1 with name head.w has been marked as '
         'ready twice. This means that multiple autograd engine  hooks have fired ...')
DIFFERS = ('DDP expects same model across all ranks, but Rank {r} has {n} params, while rank '
           '{o} has inconsistent {m} params.')
NAMES = ['backbone.w', 'head.w', 'head.extra.weight', 'head.extra.bias']


def _rec(rank, message, names=NAMES, world=2):
    return dict(rank=rank, exc_type='RuntimeError', message=message, ddp_param_names=names,
                world_size=world)


def test_unused_parameters_are_named_with_both_fixes_and_no_culprit_when_all_raised():
    text = '\n'.join(ddp_error_lines([_rec(r, UNUSED.format(r=r)) for r in (0, 1)], 2))
    assert 'DDP error on ranks 0, 1 (every rank raised it: no rank is the culprit' in text
    assert '  head.extra.weight, head.extra.bias\n' in text
    assert 'parameter #' not in text
    assert 'model_wrapper_cfg.find_unused_parameters=True' in text and 'slower' in text
    assert 'remove the unused part' in text


def test_unused_parameters_of_one_rank_name_that_rank_and_no_debug_variable_needed():
    text = '\n'.join(ddp_error_lines([_rec(1, UNUSED.format(r=1))], 2))
    assert text.startswith('DDP error on rank 1: parameters that received no gradient')
    assert 'no rank is the culprit' not in text
    assert 'head.extra.weight' in text


def test_ranks_that_differ_in_their_unused_parameters_are_grouped():
    recs = [_rec(0, UNUSED.format(r=0)), _rec(1, UNUSED.format(r=1).replace(': 2 3', ': 0'))]
    lines = ddp_error_lines(recs, 2)
    assert '  rank 0: head.extra.weight, head.extra.bias' in lines
    assert '  rank 1: backbone.w' in lines


def test_without_names_the_indices_are_kept():
    recs = [dict(rank=0, exc_type='RuntimeError', message=UNUSED.format(r=0))]
    assert '  parameter #2, parameter #3' in ddp_error_lines(recs, 2)


def test_a_parameter_ready_twice_names_it_and_static_graph():
    text = '\n'.join(ddp_error_lines([_rec(0, TWICE)], 2))
    assert 'got its gradient twice' in text and '  head.w' in text
    assert 'model_wrapper_cfg.static_graph=True' in text and 'use_reentrant=False' in text


def test_models_that_differ_name_the_ranks_counts_and_first_differing_parameters():
    short = NAMES[:2]
    recs = [
        _rec(0, DIFFERS.format(r=0, n=2, o=1, m=4), short),
        _rec(1, DIFFERS.format(r=1, n=4, o=0, m=2), NAMES)
    ]
    text = '\n'.join(ddp_error_lines(recs, 2))
    assert 'models differ between ranks' in text
    assert 'rank 0 has 2 parameters, rank 1 has 4' in text
    assert 'first difference, parameter 2: rank 1 head.extra.weight, rank 0 none' in text
    assert 'only on rank 1: head.extra.weight, head.extra.bias' in text
    assert 'the same config and code on every node' in text


def test_many_ranks_with_one_stale_node_stay_short():
    recs = [
        _rec(r, DIFFERS.format(r=r, n=4, o=0, m=2), NAMES if r // 8 == 91 else NAMES[:2], 1024)
        for r in range(1024)
    ]
    lines = ddp_error_lines(recs, 1024)
    assert len(lines) < 10
    assert any('ranks 728-735 head.extra.weight' in ln for ln in lines)


@pytest.mark.parametrize('text', [
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:446] Received data size doesn't match "
    'expected size. Is there a distributed collective mismatch?',
    'Detected mismatch between collectives on ranks. Rank 0 is running collective: ...',
])
def test_collective_mismatch_is_recognised(text):
    assert mismatch_text(['noise', 'a\n' + text]) == text[text.find('] ') + 2:] if \
        text.startswith('[') else text  # gloo's "[enforce fail at path:line]" dropped
    lines = ddp_error_lines([dict(rank=1, exc_type='RuntimeError', message=text)], 2)
    assert lines[0].startswith('the ranks ran different collectives')
    assert 'different data lengths' in lines[1] and 'skipping a step' in lines[1]


def test_other_errors_are_not_taken_for_ddp_errors():
    assert ddp_error_lines([dict(rank=0, exc_type='ValueError', message='bad value')], 2) == []
    assert mismatch_text(['Connection closed by peer']) is None
