from .ddp_runner import DDPRunner

__all__ = ['DDPRunner']
