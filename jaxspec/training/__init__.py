"""Training with optax: ``common`` (optimizer, learning-rate schedule, resumable orbax checkpoints, logs),
``losses``, ``corpus`` and ``pretrain`` (the shipped toy pair from scratch), ``distill`` (a draft model toward a
target, online), ``offline`` (a draft on stored target outputs) and ``eagle`` (an EAGLE head on the target's
stored features). Their command lines are ``jaxspec distill`` and ``jaxspec train`` (``jaxspec.cli``)."""
