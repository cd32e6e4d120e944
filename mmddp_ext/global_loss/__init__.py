"""The ranks' mean training losses in the log: the log processor and the pure exchange steps
(``log_processor.py``); ``GlobalLossHook`` (:mod:`mmddp_ext.hooks.global_loss_hook`) runs the
exchange."""
