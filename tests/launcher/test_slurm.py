"""launcher/ways/slurm: what only Slurm knows, asked of ``scontrol``. Here without a running cluster
(an empty PATH: no scontrol): every question has a safe answer and the requeue says why it did
not happen. The same calls against the suite's real local cluster: tests/slurm/."""
import pytest

from mmddp_ext.launcher.ways import slurm

NODE_LINE = ('NodeName=gpu-node07 Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 NodeAddr=10.0.0.7 '
             'NodeHostName=gpu-node07 Version=22.05.8 OS=Linux State=IDLE')


@pytest.fixture
def no_scontrol(monkeypatch, tmp_path):
    monkeypatch.setenv('PATH', str(tmp_path))


def test_fields_of_one_scontrol_line():
    fields = slurm._fields(NODE_LINE)
    assert fields['NodeAddr'] == '10.0.0.7' and fields['State'] == 'IDLE'


def test_without_scontrol_nothing_is_known(no_scontrol):
    assert slurm.hostnames('gpu-node[07-08]') == []
    assert slurm.node_addr('gpu-node07') is None
    assert slurm.job_requeue_state('123') == (False, False)
    assert slurm.master_addr(dict(SLURM_NODELIST='gpu-node[07-08]')) is None


@pytest.mark.parametrize('environ', [dict(MASTER_ADDR='10.1.2.3', SLURM_NODELIST='n[1-2]'), {}])
def test_the_master_is_not_asked_for_where_it_is_not_slurms_to_say(monkeypatch, environ):
    asked = []
    monkeypatch.setattr(slurm, '_scontrol', lambda *args: asked.append(args))
    assert slurm.master_addr(environ) is None and asked == []


def test_the_master_is_the_first_nodes_address(monkeypatch):
    answers = {
        ('show', 'hostnames', 'gpu-node[07-08]'): 'gpu-node07\ngpu-node08\n',
        ('show', 'node', '-o', 'gpu-node07'): NODE_LINE + '\n'
    }
    monkeypatch.setattr(slurm, '_scontrol', lambda *args: answers.get(args))
    assert slurm.master_addr(dict(SLURM_STEP_NODELIST='gpu-node[07-08]')) == '10.0.0.7'


@pytest.mark.parametrize('environ, words', [({}, 'not a Slurm job'),
                                            (dict(SLURM_JOB_ID='123'), 'not a batch job')])
def test_a_requeue_that_cannot_happen_says_why(no_scontrol, environ, words):
    requeued, why = slurm.requeue_job(environ)
    assert not requeued and words in why


def test_a_job_without_requeue_is_told_the_sbatch_flag(monkeypatch):
    monkeypatch.setattr(slurm, '_scontrol',
                        lambda *args: 'JobId=123 BatchFlag=1 Requeue=0 JobState=RUNNING\n')
    requeued, why = slurm.requeue_job(dict(SLURM_JOB_ID='123'))
    assert not requeued and 'sbatch --requeue' in why


def test_the_ways_requeue_only_a_schedulers_job(no_scontrol):
    from mmddp_ext.launcher import ways
    assert ways.requeue({}) is None  # no scheduler's job: nothing said, --resume continues
    requeued, why = ways.requeue(dict(SLURM_JOB_ID='123'))
    assert not requeued and 'not a batch job' in why
