"""Model families. ``families`` is the registry (``ModelFamily``, ``Weight``, ``register``); every other module is
one family (a config dataclass, ``init`` / ``from_params``, a weight table and its ``FAMILY`` record) or a part they
share: ``stack`` (the decoder stack every family builds on), ``rope``, ``llama_config``, and ``eagle`` (the EAGLE
head's network). A module may be only a record over another's model (``phi3``). A new family is a new module here
that calls ``families.register``."""
