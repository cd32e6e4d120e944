"""The training loss in the log speaks for every rank (``mmddp_ext.global_loss.log_processor``): two
ranks of the demo (started by hand from the preloaded stack, ``tests/preloaded.py``) whose
total losses differ by construction (``RankLossOffset`` adds 10 to rank 1's), logged every
iteration with a window of one iteration. Rank 0's log line carries the mean of the two ranks'
values of that iteration for every loss, with the ranks' minimum and maximum of the total
beside it; ``default_hooks.global_loss=None`` logs rank 0's own values."""
import json
import os.path as osp
import re

import pytest

from conftest import check_ok, demo_options, demo_with_hooks
from preloaded import dist_train

LINE = re.compile(r'Epoch\(train\)\s*\[1\]\[\s*(\d+)/\d+\].*')


def _values(line: str) -> dict:
    return {k: float(v) for k, v in re.findall(r'\b(loss\w*): (-?[0-9.]+)', line)}


def _recorded(folder: str, rank: int) -> list:
    with open(osp.join(folder, f'rank{rank}.jsonl')) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
@pytest.mark.parametrize('global_losses', [True, False])
def test_rank_0_logs_the_mean_over_the_ranks(demo_data, tmp_path, global_losses):
    rec = str(tmp_path / 'rec')
    cfg = demo_with_hooks(tmp_path, f"dict(type='RankLossOffset', out_dir={rec!r})",
                          ['rank_loss_offset'])
    out = check_ok(
        dist_train([
            cfg, '--work-dir',
            str(tmp_path / 'w'), *demo_options(demo_data, 1), 'log_processor.window_size=1',
            *([] if global_losses else ['default_hooks.global_loss=None'])
        ], 2, str(tmp_path / 'ranks')))
    lines = {int(m.group(1)): _values(m.group(0)) for m in LINE.finditer(out)}
    ranks = [_recorded(rec, 0), _recorded(rec, 1)]
    assert len(lines) == len(ranks[0]) == len(ranks[1]) == 2, out[-3000:]
    for it, logged in lines.items():
        mine, theirs = ranks[0][it - 1], ranks[1][it - 1]
        assert theirs['loss'] - mine['loss'] > 5  # rank 1's is 10 more, by construction
        if not global_losses:
            assert logged['loss'] == pytest.approx(mine['loss'], abs=1e-6)
            assert 'loss_rank_min' not in logged
            continue
        for key in ('loss', 'loss_kpt'):
            assert logged[key] == pytest.approx((mine[key] + theirs[key]) / 2, abs=1e-6), key
        assert logged['loss_rank_min'] == pytest.approx(mine['loss'], abs=1e-6)
        assert logged['loss_rank_max'] == pytest.approx(theirs['loss'], abs=1e-6)
