# mmddp_ext runtime defaults. Inherit it after your model config:
#
#   _base_ = ['mmpose::body_2d_keypoint/...py', 'mmddp_ext::_base_/ddp_runtime.py']
#
# `mmddp_ext::` resolves whenever mmddp_ext was imported before the config is parsed (our
# tools/dist_train.py does that). With other entry points (e.g. MMPose's tools/train.py) use a
# relative path to this file instead, or add `custom_imports` plus the keys below yourself.
custom_imports = dict(imports=['mmddp_ext'], allow_failed_imports=False)

# Plan batch size, accumulation, LR and iteration schedules for the number of processes.
runner_type = 'DDPRunner'
scaling = dict(
    global_batch_size=None,  # samples per optimizer step over all ranks and accumulation
    max_batch_per_device=None,  # cap per device (default: train_dataloader.batch_size);
    # 'auto': measure the largest batch that fits on every rank
    base_batch_size=None,  # global batch the LR was tuned for (default: auto_scale_lr's)
    lr_rule='linear',  # 'linear' | 'sqrt' | 'none'
    schedule='keep_samples',  # or 'keep_iters'
    memory_budget_mib=None,  # per-rank budget; on a CPU required by 'auto'
    on_oom=None,  # 'microbatch': redo an out-of-memory step as micro-batches;
    # 'raise': stop; None: 'microbatch' with 'auto', else 'raise'
)
