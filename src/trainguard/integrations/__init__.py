"""Adapters to the training frameworks: each module imports its framework only when it is imported
itself, so trainguard never depends on them.

- ``trainguard.integrations.huggingface``: ``TrainguardCallback`` for ``transformers.Trainer`` and
  ``resume_from_checkpoint()``.
- ``trainguard.integrations.lightning``: ``TrainguardCallback`` for ``lightning`` (or
  ``pytorch_lightning``) and ``ckpt_path()``.
- ``trainguard.integrations.accelerate``: ``load_state(accelerator)`` and ``PreemptionGuard``.
- ``trainguard.integrations.deepspeed``: ``load_checkpoint(engine, save_dir)`` and ``PreemptionGuard``.
- ``trainguard.integrations.loop``: ``PreemptionGuard`` for any hand-written loop.

And to the schedulers a foreground run answers to (stdlib only):

- ``trainguard.integrations.slurm``: whether and how ``run --requeue`` asks Slurm to requeue the job.
- ``trainguard.integrations.kubernetes``: the verdict as a pod's termination message.
"""
