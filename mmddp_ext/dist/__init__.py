from .env import DistEnv, DistEnvError, choose_backend, detect_launcher, read_dist_env
from .launch import init_distributed, launch_workers, shutdown

__all__ = [
    'DistEnv', 'DistEnvError', 'choose_backend', 'detect_launcher', 'read_dist_env',
    'init_distributed', 'launch_workers', 'shutdown'
]
