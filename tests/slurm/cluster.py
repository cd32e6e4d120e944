"""A real Slurm cluster on this machine for the tests: its own ``munged``, one ``slurmctld`` and
two ``slurmd`` (nodes ``n1``, ``n2``, both at ``NodeAddr=127.0.0.1``), partitions ``cpu``
(default) and ``gpu`` (no GRES configured), everything in one temporary folder.

Nothing outside that folder is changed: munged gets its own key and socket (Slurm is pointed at
it by ``AuthInfo=socket=...``), the daemons their own ports, state and logs, and every command
of the tests finds the cluster through ``SLURM_CONF``. Two test sessions can run one each.
"""
import os
import os.path as osp
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

DAEMONS = ('munged', 'slurmctld', 'slurmd')
CLIENTS = ('sinfo', 'squeue', 'srun', 'sbatch', 'scontrol', 'scancel', 'munge')
NODES = ('n1', 'n2')
START_BOUND_S = 60.0  # the whole cluster starts in a few seconds


class SlurmUnavailable(RuntimeError):
    """Slurm is not installed here or did not start; the message says why."""


def missing_tools() -> List[str]:
    """The Slurm and munge programs that are not on PATH (daemons are looked up in sbin too)."""
    path = os.environ.get('PATH', '') + os.pathsep + '/usr/sbin' + os.pathsep + '/sbin'
    return [t for t in DAEMONS + CLIENTS if shutil.which(t, path=path) is None]


def _which(tool: str) -> str:
    path = os.environ.get('PATH', '') + os.pathsep + '/usr/sbin' + os.pathsep + '/sbin'
    return shutil.which(tool, path=path)


def _free_ports(n: int) -> List[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(('127.0.0.1', 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _slurm_conf(folder: str, user: str, ports: List[int], first_job_id: int = 1) -> str:
    host = socket.gethostname()
    nodes = '\n'.join(f'NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs=2 '
                      'State=UNKNOWN' for n, p in zip(NODES, ports[1:]))
    return f"""\
ClusterName=mmddptest
FirstJobId={first_job_id}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
# cred_expire: requeued jobs wait cred_expire + 1 s before they may start again (default 120)
AuthInfo=socket={folder}/munge/socket,cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
{nodes}
PartitionName=cpu Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
PartitionName=gpu Nodes=n[1-2] MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class SlurmCluster:
    """A running local cluster. Commands get :meth:`env`; :meth:`stop` ends it.

    Attributes:
        folder: the temporary folder of everything (config, state, logs, munge socket).
        conf: path of its ``slurm.conf``.
    """

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix='mmddp_slurm_')
        self.conf = osp.join(self.folder, 'slurm.conf')
        self.procs: Dict[str, subprocess.Popen] = {}

    # ---- use ----
    def env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """``base`` (default ``os.environ``) without the variables of any enclosing Slurm job,
        with ``SLURM_CONF`` naming this cluster."""
        env = {k: v for k, v in (base or os.environ).items() if not k.startswith('SLURM_')}
        env['SLURM_CONF'] = self.conf
        return env

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm client command; output captured as text."""
        return subprocess.run(
            list(cmd), env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=timeout)

    def node_states(self) -> Dict[str, str]:
        """``{node: state}`` as sinfo says (``idle``, ``alloc``, ``mix``, ``down*``, ...)."""
        out = self.run('sinfo', '-h', '-N', '-o', '%N %t').stdout
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def job(self, job_id: str) -> Dict[str, str]:
        """``scontrol show job -o JOB`` as a dict (empty when Slurm forgot the job)."""
        out = self.run('scontrol', 'show', 'job', '-o', job_id).stdout.strip()
        return dict(p.split('=', 1) for p in out.split() if '=' in p) if out else {}

    def wait_job(
        self, job_id: str, bound: float = 600,
        states=('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY')
    ) -> dict:
        """Poll the job until it reaches one of ``states`` (within ``bound`` seconds)."""
        deadline = time.monotonic() + bound
        info = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get('JobState') in states:
                return info
            time.sleep(1)
        raise TimeoutError(f'Slurm job {job_id} not in {states} after {bound:.0f} s: {info}')

    # ---- start and stop ----
    def start(self) -> 'SlurmCluster':
        """Start munged, slurmctld and both slurmd; wait until sinfo shows both nodes idle.

        Raises:
            SlurmUnavailable: a program is missing, or a daemon did not come up (with the tail
                of its log).
        """
        missing = missing_tools()
        if missing:
            raise SlurmUnavailable(f'not installed: {", ".join(missing)} (Debian/Ubuntu: '
                                   'apt-get install slurm-wlm munge)')
        user = pwd.getpwuid(os.getuid()).pw_name
        for sub in ('state', 'log', 'spool/n1', 'spool/n2', 'munge', 'munge_key'):
            os.makedirs(osp.join(self.folder, sub))
        os.chmod(self.folder, 0o711)
        os.chmod(osp.join(self.folder, 'munge'), 0o711)  # munged: the socket's folder o+x
        os.chmod(osp.join(self.folder, 'munge_key'), 0o700)
        key = osp.join(self.folder, 'munge_key', 'munge.key')
        with open(key, 'wb') as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        with open(self.conf, 'w') as f:
            # each pytest-xdist worker starts a cluster of its own: their job IDs, and so the
            # MASTER_PORT derived from them (20000 + id % 10000), differ as one cluster's do
            worker = os.environ.get('PYTEST_XDIST_WORKER', 'gw0')[2:]
            first = 1 + 1000 * int(worker) if worker.isdigit() else 1
            f.write(_slurm_conf(self.folder, user, _free_ports(1 + len(NODES)), first))
        m = osp.join(self.folder, 'munge')
        self._spawn('munged', [
            _which('munged'), '-F', f'--key-file={key}', f'--socket={m}/socket',
            f'--pid-file={m}/munged.pid', f'--seed-file={m}/munged.seed',
            f'--log-file={self.folder}/log/munged.log'
        ])
        self._wait('the munge socket', lambda: osp.exists(f'{m}/socket'), 'munged')
        self._spawn('slurmctld', [_which('slurmctld'), '-D', '-f', self.conf])
        self._wait('slurmctld to answer scontrol ping',
                   lambda: 'UP' in self.run('scontrol', 'ping').stdout, 'slurmctld')
        for node in NODES:
            self._spawn(f'slurmd-{node}', [_which('slurmd'), '-D', '-N', node, '-f', self.conf])
        self._wait('sinfo to show n1 and n2 idle',
                   lambda: [self.node_states().get(n) for n in NODES] == ['idle'] * len(NODES),
                   'slurmd-n1')
        return self

    def _spawn(self, name: str, cmd: List[str]) -> None:
        log = open(osp.join(self.folder, 'log', f'{name}.out'), 'w')
        self.procs[name] = subprocess.Popen(cmd, env=self.env(), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def _wait(self, what: str, ready, daemon: str) -> None:
        deadline = time.monotonic() + START_BOUND_S
        next_say = time.monotonic() + 10
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise SlurmUnavailable(f'{dead[0]} exited with {self.procs[dead[0]].returncode} '
                                       f'while waiting for {what}: {self.log_tail(dead[0])}')
            if ready():
                return
            if time.monotonic() >= next_say:
                print(f'[slurm fixture] still waiting for {what} (nodes: {self.node_states()})',
                      flush=True)
                next_say += 10
            time.sleep(0.2)
        raise SlurmUnavailable(f'no {what} within {START_BOUND_S:.0f} s: {self.log_tail(daemon)}')

    def log_tail(self, name: str, lines: int = 15) -> str:
        """The last lines of a daemon's own output and log, for messages."""
        out = []
        for path in (osp.join(self.folder, 'log',
                              f'{name}.out'), osp.join(self.folder, 'log', f'{name}.log')):
            if osp.exists(path):
                out += open(path, errors='replace').read().splitlines()[-lines:]
        return ' | '.join(out) or '(no output)'

    def stop(self) -> None:
        """Cancel what is left of the jobs, then end every daemon by its pid."""
        if 'slurmctld' in self.procs and self.procs['slurmctld'].poll() is None:
            self.run('scancel', '--full', '--state=RUNNING')
            self.run('scancel', '--state=PENDING')
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.run('squeue', '-h').stdout.strip():
                time.sleep(0.5)
        for name in reversed(list(self.procs)):  # slurmd, slurmctld, then munged
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
