"""node/facts: the cgroup's limits where set (a cgroup folder written here), and this machine's
own numbers, read beside the code under test."""
import os

import psutil

from mmddp_ext.node.facts import cpus, host_memory, node_facts, shm_size


def _cgroup(tmp_path, **files):
    for name, text in files.items():
        path = tmp_path / name.replace('__', '/')
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_a_containers_memory_limit_wins_over_the_ram(tmp_path):
    ram = psutil.virtual_memory().total
    assert host_memory(_cgroup(tmp_path / 'a', **{'memory.max': f'{2**30}\n'})) == min(ram, 2**30)
    assert host_memory(_cgroup(tmp_path / 'b', **{'memory.max': 'max\n'})) == ram
    v1 = _cgroup(tmp_path / 'c', **{'memory__memory.limit_in_bytes': f'{2**31}\n'})
    assert host_memory(v1) == min(ram, 2**31)
    assert host_memory(str(tmp_path / 'none')) == ram


def test_a_cpu_quota_caps_the_cores(tmp_path):
    mine = len(os.sched_getaffinity(0))
    assert cpus(_cgroup(tmp_path / 'a', **{'cpu.max': '150000 100000\n'})) == min(mine, 2)
    assert cpus(_cgroup(tmp_path / 'b', **{'cpu.max': 'max 100000\n'})) == mine
    assert cpus(str(tmp_path / 'none')) == mine


def test_shm_is_the_size_of_its_file_system(tmp_path):
    st = os.statvfs('/dev/shm')
    assert shm_size('/dev/shm') == st.f_blocks * st.f_frsize
    assert shm_size(str(tmp_path / 'missing')) is None
    facts = node_facts()
    assert facts.shm_size == shm_size() and facts.cpus >= 1 and facts.host_memory > 0
