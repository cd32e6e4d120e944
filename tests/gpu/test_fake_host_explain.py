"""``--explain --memory`` on the fake GPU host: the forecast plans for the GPU's memory, reads
the process's context from NVML and device peaks per step, and counts other processes on each
local rank's GPU as stray (the foreign process on GPU 0; not its own context)."""
import json

import pytest

from mmddp_ext.gpu.fake import FIELD_FOREIGN, FakeGpus, make_fake_host

from conftest import DEMO_CONFIG, PYTHON, check_ok, demo_options, run

MIB = 2**20


@pytest.fixture(scope='module')
def forecast(demo_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp('fake_explain')
    folder = str(tmp / 'host')
    env = make_fake_host(folder, count=2, foreign=[(0, 4242, FIELD_FOREIGN)])
    out = check_ok(
        run([
            PYTHON, 'tools/dist_train.py', DEMO_CONFIG, '--explain', '--memory', '--json',
            '--world-size', '2', '--work-dir',
            str(tmp / 'w'), *demo_options(demo_data)
        ], env=env, timeout=600))
    return json.loads(out.strip().splitlines()[-1])['memory'], FakeGpus(folder)


@pytest.mark.slow
def test_plans_for_the_gpu_s_memory_not_the_host_s(forecast):
    memory, gpus = forecast
    assert memory['device_mib'] == round(gpus.mem_get_info(0)[1] / MIB, 1)
    assert memory['device_how'].startswith('total memory of cuda:0 (')
    assert 'on cuda:0' in memory['method'] and "torch's peak allocated" in memory['method']


@pytest.mark.slow
def test_context_comes_from_nvml(forecast):
    memory, _ = forecast
    context = memory['ddp_extra_mib']['process_context']
    assert context['value'] > 0 and not context['estimate']
    assert 'NVML: this process on its GPU' in context['how']


@pytest.mark.slow
def test_stray_is_the_foreign_process_on_rank_0_s_gpu_only(forecast):
    memory, _ = forecast
    stray = memory['ddp_extra_mib']['stray_contexts']
    # the forecasting process's own context on GPU 0 is not counted, only the foreign one
    assert stray['per_rank'] == [round(FIELD_FOREIGN / MIB, 1), 0.0]
    peak0, peak1 = memory['predicted_peak_mib']
    assert peak0 - peak1 == pytest.approx(stray['per_rank'][0], abs=0.2)
    assert memory['max_batch_ddp'] < memory['max_batch_single']
