"""runner/work_dir.py: the line for a work dir that some ranks do not see. The check itself and
the checkpoint sent to a node without it run on two nodes in mount namespaces of their own:
tests/e2e/test_nothing_shared.py (one machine's ranks see every folder)."""
import pytest

from mmddp_ext.runner.work_dir import not_shared_line


@pytest.mark.parametrize('unseen,where', [
    ({
        1: 'n2'
    }, 'rank 0 writes there, and rank 1 on n2 cannot see it'),
    ({
        2: 'n2',
        3: 'n2',
        4: 'n3'
    }, 'and ranks 2, 3 on n2; rank 4 on n3 cannot see it'),
])
def test_the_line_names_the_ranks_their_hosts_and_the_fix(unseen, where):
    line = not_shared_line('/scratch/w', unseen)
    assert line.startswith('the work dir /scratch/w is not shared: ') and where in line
    assert 'rank 0 sends the checkpoint a run starts from' in line
    assert 'give --work-dir a folder every node sees' in line
