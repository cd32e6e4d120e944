"""Tests of :mod:`mmddp_ext.memory.stray` on recorded identities and NVML tables."""
import json

import pytest

from mmddp_ext.memory.stray import (DeviceTable, Finding, GpuProcess, RankIdentity, find_stray,
                                    format_bytes)

GIB = 2**30
MIB = 2**20
TOTAL = int(23.64 * GIB)


def table(host, index, *procs, total=TOTAL):
    return DeviceTable(host, index, total, tuple(GpuProcess(pid, used) for pid, used in procs))


def two_ranks(host='node1', pids=(727401, 727402)):
    return [RankIdentity(0, host, pids[0], 0), RankIdentity(1, host, pids[1], 1)]


def test_users_oom_is_one_cross_rank_finding():
    ranks = two_ranks()
    tables = [
        table('node1', 0, (727401, int(21.5 * GIB)), (727402, int(1.89 * GIB))),
        table('node1', 1, (727402, 20 * GIB)),
    ]
    findings = find_stray(ranks, tables)
    assert len(findings) == 1
    f = findings[0]
    assert (f.kind, f.host, f.device_index, f.pid, f.rank) == ('cross_rank', 'node1', 0, 727402, 1)
    assert f.owner_ranks == (0, )
    assert f.used_bytes == int(1.89 * GIB)
    for part in ('rank 1', 'pid 727402', 'GPU 0', '1.89 GiB', 'set_device', 'rank 0', 'host node1',
                 '23.64 GiB', 'map_location', 'empty_cache'):
        assert part in f.message, part
    # the three usual causes, in the order a user checks them: the device pin, a load
    # without map_location, a cache call before the pin
    m = f.message
    assert m.index('set_device') < m.index('map_location') < m.index('empty_cache')


def test_clean_two_rank_job_has_no_findings():
    tables = [table('node1', 0, (727401, 20 * GIB)), table('node1', 1, (727402, 20 * GIB))]
    assert find_stray(two_ranks(), tables) == []


def test_foreign_process_on_owned_device():
    tables = [table('node1', 0, (727401, GIB)), table('node1', 1, (727402, GIB), (5555, 3 * GIB))]
    [f] = find_stray(two_ranks(), tables)
    assert (f.kind, f.device_index, f.pid, f.rank, f.owner_ranks) == ('foreign_process', 1, 5555,
                                                                      None, (1, ))
    assert f.message == ('pid 5555 (not part of this job) holds 3.00 GiB on GPU 1 of host '
                         'node1, the device of rank 1: another job or a leftover process '
                         'shares the GPU')


def test_devices_without_owner_are_ignored():
    tables = [
        table('node1', 0, (727401, GIB)),
        table('node1', 1, (727402, GIB)),
        table('node1', 2, (5555, GIB), (727402, GIB)),
        table('node9', 0, (1, GIB))
    ]
    assert find_stray(two_ranks(), tables) == []


def test_container_pids_never_match_gives_one_unmatched_finding():
    ranks = two_ranks(pids=(12, 13))  # pids inside the container
    tables = [
        table('node1', 0, (727401, GIB), (727402, GIB)),
        table('node1', 1, (727402, GIB), (9999, GIB))
    ]
    findings = find_stray(ranks, tables)
    assert len(findings) == 1
    f = findings[0]
    assert (f.kind, f.host, f.device_index, f.pid, f.rank,
            f.used_bytes) == ('unmatched_pids', 'node1', 0, None, None, None)
    assert f.owner_ranks == (0, 1)
    assert 'namespace' in f.message and 'container' in f.message and '12, 13' in f.message


def test_container_check_is_per_host():
    ranks = two_ranks(
        pids=(12, 13)) + [RankIdentity(2, 'node2', 100, 0),
                          RankIdentity(3, 'node2', 101, 1)]
    tables = [
        table('node1', 1, (727402, GIB)),
        table('node1', 0, (727401, GIB)),
        table('node2', 0, (100, GIB), (101, GIB)),
        table('node2', 1, (101, GIB))
    ]
    findings = find_stray(ranks, tables)
    assert [(f.kind, f.host, f.device_index, f.pid)
            for f in findings] == [('unmatched_pids', 'node1', 0, None),
                                   ('cross_rank', 'node2', 0, 101)]
    assert findings[1].rank == 3 and findings[1].owner_ranks == (2, )


def test_empty_tables_are_not_a_pid_namespace_problem():
    assert find_stray(two_ranks(), [table('node1', 0), table('node1', 1)]) == []


def test_same_pid_on_different_hosts_is_not_confused():
    ranks = [
        RankIdentity(0, 'node1', 500, 0),
        RankIdentity(1, 'node1', 501, 1),
        RankIdentity(2, 'node2', 501, 0),
        RankIdentity(3, 'node2', 500, 1)
    ]
    # pid 501 on node2 GPU 0 is rank 2, the owner: normal (not rank 1 of node1).
    tables = [
        table('node1', 0, (500, GIB)),
        table('node1', 1, (501, GIB)),
        table('node2', 0, (501, GIB)),
        table('node2', 1, (500, GIB), (501, MIB))
    ]
    findings = find_stray(ranks, tables)
    assert len(findings) == 1
    f = findings[0]
    assert (f.kind, f.host, f.device_index, f.pid, f.rank, f.owner_ranks) == ('cross_rank', 'node2',
                                                                              1, 501, 2, (3, ))
    assert 'rank 2 (pid 501)' in f.message and 'host node2' in f.message


def test_findings_sorted_by_host_device_pid():
    ranks = two_ranks() + [RankIdentity(2, 'node0', 7, 0)]
    tables = [
        table('node1', 1, (727402, 1), (9000, 1), (727401, 1)),
        table('node1', 0, (727401, 1), (8000, 1)),
        table('node0', 0, (7, 1), (6, 1))
    ]
    found = [(f.host, f.device_index, f.pid, f.kind) for f in find_stray(ranks, tables)]
    assert found == [('node0', 0, 6, 'foreign_process'), ('node1', 0, 8000, 'foreign_process'),
                     ('node1', 1, 9000, 'foreign_process'), ('node1', 1, 727401, 'cross_rank')]
    assert find_stray(list(reversed(ranks)), list(reversed(tables))) == find_stray(ranks, tables)


def test_cpu_ranks_own_nothing():
    ranks = [RankIdentity(0, 'node1', 10, None), RankIdentity(1, 'node1', 11, None)]
    assert find_stray(ranks, [table('node1', 0, (10, GIB), (5555, GIB))]) == []


def test_cpu_rank_holding_gpu_memory_is_cross_rank():
    ranks = [RankIdentity(0, 'node1', 10, 0), RankIdentity(1, 'node1', 11, None)]
    [f] = find_stray(ranks, [table('node1', 0, (10, GIB), (11, 300 * MIB))])
    assert (f.kind, f.rank, f.pid, f.owner_ranks) == ('cross_rank', 1, 11, (0, ))
    assert '300.00 MiB' in f.message


def test_shared_device_owned_by_two_ranks():
    ranks = [
        RankIdentity(0, 'node1', 10, 0),
        RankIdentity(1, 'node1', 11, 0),
        RankIdentity(2, 'node1', 12, 1)
    ]
    [f] = find_stray(
        ranks,
        [table('node1', 0, (10, 1), (11, 1),
               (12, 1)), table('node1', 1, (12, 1))])
    assert (f.rank, f.owner_ranks) == (2, (0, 1))
    assert 'the device of ranks 0, 1' in f.message


def test_unknown_usage_formats_as_unknown():
    [f] = find_stray(
        two_ranks(),
        [table('node1', 0, (727401, None), (727402, None)),
         table('node1', 1, (727402, None))])
    assert f.used_bytes is None
    assert 'holds unknown on GPU 0' in f.message


def test_duplicate_tables_and_rows_are_merged():
    tables = [
        table('node1', 0, (727401, 1), (5555, MIB), (5555, MIB)),
        table('node1', 0, (727401, 1), (5555, 9 * GIB)),
        table('node1', 1, (727402, 1))
    ]
    [f] = find_stray(two_ranks(), tables)
    assert (f.pid, f.used_bytes) == (5555, 2 * MIB)


def test_duplicate_rank_is_an_error():
    ranks = two_ranks() + [RankIdentity(1, 'node2', 3, 0)]
    with pytest.raises(ValueError, match='rank 1'):
        find_stray(ranks, [])


@pytest.mark.parametrize('make', [
    lambda: RankIdentity(-1, 'h', 1, 0),
    lambda: RankIdentity(0, 'h', 1, -2),
    lambda: GpuProcess(3, -5),
    lambda: DeviceTable('h', 0, -1, ()),
])
def test_negative_values_are_rejected(make):
    with pytest.raises(ValueError, match='-'):
        make()


def test_finding_to_dict_is_json_ready():
    [f] = find_stray(two_ranks(),
                     [table('node1', 0, (727401, 1), (727402, 5)),
                      table('node1', 1, (727402, 1))])
    data = json.loads(json.dumps(f.to_dict()))
    assert data == {
        'kind': 'cross_rank',
        'host': 'node1',
        'device_index': 0,
        'pid': 727402,
        'rank': 1,
        'owner_ranks': [0],
        'used_bytes': 5,
        'message': f.message
    }


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match='oops'):
        Finding('oops', 'h', 0, None, None, (), None, '')


@pytest.mark.parametrize('n, text', [
    (None, 'unknown'),
    (0, '0 B'),
    (512, '512 B'),
    (1023, '1023 B'),
    (1024, '1.00 KiB'),
    (1536, '1.50 KiB'),
    (int(59.25 * MIB), '59.25 MiB'),
    (int(1.89 * GIB), '1.89 GiB'),
    (TOTAL, '23.64 GiB'),
    (MIB - 1, '1.00 MiB'),
    (3 * 2**40, '3.00 TiB'),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_format_bytes_rejects_negative():
    with pytest.raises(ValueError, match='-3'):
        format_bytes(-3)
