"""node/facts: the cgroup's limits where set (a cgroup folder written here), and this machine's
own numbers, read beside the code under test."""
import os

import psutil

from mmddp_ext.node.facts import (cpus, host_memory, memory_cgroup, memory_limit, node_facts,
                                  oom_kills, shm_size)


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


def test_the_memory_cgroup_is_found_from_proc_self_cgroup(tmp_path):
    root = tmp_path / 'fs'
    (root / 'memory' / 'job' / 'step').mkdir(parents=True)
    v1 = tmp_path / 'v1'
    v1.write_text('5:cpu,cpuacct:/x\n4:memory:/job/step\n0::/\n')
    assert memory_cgroup(str(v1), str(root)) == str(root / 'memory' / 'job' / 'step')
    v2_root = tmp_path / 'v2fs'
    (v2_root / 'user.slice').mkdir(parents=True)
    v2 = tmp_path / 'v2'
    v2.write_text('0::/user.slice\n')
    assert memory_cgroup(str(v2), str(v2_root)) == str(v2_root / 'user.slice')
    namespaced = tmp_path / 'ns'
    namespaced.write_text('0::/kubepods/pod1\n')  # a cgroup namespace shows its own as root
    assert memory_cgroup(str(namespaced), str(v2_root)) == str(v2_root)
    assert memory_cgroup(str(tmp_path / 'missing'), str(root)) is None


def test_oom_kills_and_limit_are_read_from_v1_and_v2(tmp_path):
    v2 = _cgroup(
        tmp_path / 'a', **{
            'memory.events': 'low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n',
            'memory.max': f'{2**30}\n'
        })
    assert oom_kills(v2) == 2 and memory_limit(v2) == 2**30
    v1 = _cgroup(
        tmp_path / 'b', **{
            'memory.oom_control': 'oom_kill_disable 0\nunder_oom 0\n'
            'oom_kill 5\n',
            'memory.limit_in_bytes': '9223372036854771712\n'
        })
    assert oom_kills(v1) == 5 and memory_limit(v1) is None  # v1's "unlimited"
    assert oom_kills(str(tmp_path / 'none')) is None and oom_kills(None) is None
