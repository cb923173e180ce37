"""The host API, in the order a call runs: ``config`` (``GenerationConfig``, one call's settings) -> ``request``
(every argument checked and the prompts tokenized, before anything compiles) -> ``inputs`` (buckets, the static
``LoopSpec`` and the traced ``LoopInputs``) -> ``generate`` (``generate``, ``stream``: the γ decision and the
compiled loop of ``jaxspec.loop``) -> ``results`` (``GenerationResult`` and ``Stats``); ``engine`` runs many
requests by continuous batching on the same stages."""
