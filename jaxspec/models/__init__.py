"""Built-in model families, one module each: a config dataclass, ``init`` / ``from_params``, a weight table and the
family's ``FAMILY`` record (``jaxspec.families``). A module may be only a record over another's model (``phi3``)."""
