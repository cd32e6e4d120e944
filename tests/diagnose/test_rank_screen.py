"""A failed rank's own screen (``mmddp_ext/diagnose/rank_screen.py``) from the records the real
``record_failure`` writes; the launch ways that print it: tests/e2e/test_rank_screens.py."""
import os

import pytest

from mmddp_ext.diagnose.rank_screen import front_prints_diagnosis, print_rank_screen, rank_screen
from mmddp_ext.diagnose.records import record_failure


def _raised(exc):
    try:
        raise exc
    except Exception as e:
        return e


PEER_LOST = RuntimeError('[gloo/transport/tcp/pair.cc:561] Connection closed by peer '
                         '[127.0.0.1]:9432')


def test_the_rank_that_raised_shows_its_cause_and_the_jobs_command(tmp_path):
    work = str(tmp_path)
    record_failure(work, 1, _raised(ValueError('bad sample 17')))
    text = rank_screen(work, 1, wait=0)
    assert text.startswith('==== mmddp_ext: rank 1 failed (what this rank sees) ====')
    assert 'ValueError: bad sample 17' in text and 'full traceback:' in text
    assert text.endswith(f'the whole job: python -m mmddp_ext.diagnose {work}')


def test_the_rank_that_lost_its_peer_names_the_peer_that_raised(tmp_path):
    work = str(tmp_path)
    record_failure(work, 1, _raised(ValueError('bad sample 17')))
    record_failure(work, 0, _raised(PEER_LOST))
    text = rank_screen(work, 0, wait=0)
    assert 'rank 0 (host ' in text and ') lost its peer after iteration -' in text
    assert 'the other ranks, as this rank sees them:' in text
    assert 'raised ValueError: bad sample 17' in text and 'its record: ' in text


def test_a_lost_peer_with_no_record_sends_the_user_to_the_others_logs(tmp_path):
    work = str(tmp_path)
    record_failure(work, 0, _raised(PEER_LOST))
    sleeps = []
    text = rank_screen(work, 0, wait=0, sleep=sleeps.append)
    assert 'no other rank left a record or a progress file here' in text
    assert not sleeps  # nothing to wait for past the bound


def test_a_rank_without_a_record_prints_nothing(tmp_path):
    assert rank_screen(str(tmp_path), 0, wait=0) == ''


@pytest.mark.parametrize(
    'environ, ours',
    [
        ({}, False),
        ({
            'MMDDP_LAUNCH_REPORT': '/w/launch.json'
        }, True),  # dist_train.sh's torchrun front
        ({
            'MMDDP_WORK_DIR_NOTE': '/tmp/note'
        }, True),  # mmddp_ext.launch()
        ({
            'TORCHELASTIC_RUN_ID': 'x'
        }, False),  # torchrun itself
    ])
def test_only_our_fronts_print_the_diagnosis_for_the_ranks(environ, ours):
    assert front_prints_diagnosis(environ) is ours


def test_under_our_front_the_rank_prints_nothing(tmp_path, capsys):
    work = str(tmp_path)
    record_failure(work, 1, _raised(ValueError('bad sample 17')))
    print_rank_screen(work, 1, {'MMDDP_LAUNCH_REPORT': os.path.join(work, 'launch.json')})
    assert capsys.readouterr().err == ''
    print_rank_screen(work, 1, {})
    assert 'ValueError: bad sample 17' in capsys.readouterr().err
