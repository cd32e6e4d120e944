from .scaling_hook import ScalingHook

__all__ = ['ScalingHook']
