"""A made-up scheduler, written as every way of :mod:`mmddp_ext.launcher.ways` is: one module
(tests/launcher/test_ways.py lists it in ``WAYS`` and reads a job through it). Its processes get
``FAKE_TASK`` (global index), ``FAKE_TASKS`` (how many), ``FAKE_NODE_TASK`` (index on the node),
``FAKE_NODE_TASKS`` and ``FAKE_CPUS``; its tool would say where rank 0 runs."""
from typing import Mapping, Optional

from mmddp_ext.launcher.variables import copied, master_from

NAME = 'fake'
TASK_CPUS_OF = 'its fake-scheduler task'


def detect(environ: Mapping[str, str]) -> bool:
    return 'FAKE_TASK' in environ and environ.get('FAKE_TASKS', '1') != '1'


def ask(environ: Mapping[str, str]) -> dict:
    return {'master_addr': '10.9.8.7'}  # as its own tool would answer


def to_torch(environ: Mapping[str, str], asked: Mapping[str, str]) -> dict:
    out = copied(environ,
                 (('FAKE_TASK', 'RANK'), ('FAKE_TASKS', 'WORLD_SIZE'),
                  ('FAKE_NODE_TASK', 'LOCAL_RANK'), ('FAKE_NODE_TASKS', 'LOCAL_WORLD_SIZE')), NAME,
                 'run it under fake')
    master_from(environ, out, asked.get('master_addr'), '4242')
    return out


def task_cpus(environ: Mapping[str, str]) -> Optional[int]:
    return int(environ['FAKE_CPUS']) if environ.get('FAKE_CPUS', '').isdigit() else None
