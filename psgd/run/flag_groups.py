"""The sections of ``psgd train --help``: each feature's flags together."""

#: ``--help``'s sections: title -> the flags of one feature (a flag in none goes under "other")
GROUPS = {
    "data and model": ("data", "model", "augment"),
    "protocol": ("protocol", "servers", "staleness", "staleness_max", "overlap", "topology"),
    "staleness compensation": ("staleness_comp", "comp_lambda", "staleness_lr"),
    "optimizer and learning rate": ("optimizer", "lr", "lr_schedule", "alpha", "warmup",
                                    "lr_step_every", "lr_gamma", "momentum", "weight_decay"),
    "run length": ("batch_size", "epochs", "steps", "seed"),
    "compression": ("compress", "compress_bucket", "error_feedback", "momentum_correction"),
    "evaluation and logs": ("eval_every", "eval_samples", "log_every", "log", "overwrite",
                            "quiet", "tensorboard"),
    "checkpoints and resuming": ("checkpoint_dir", "checkpoint_every", "resume"),
    "failures and stalls": ("stall_timeout", "stall_abort", "skip_nonfinite"),
    "record, replay, timeline": ("record", "replay", "timeline"),
    "stragglers": ("straggler",),
    "sparse models": ("hold_hot",),
    "model parallelism inside layers": ("tensor", "spatial", "grid", "dtype"),
}
