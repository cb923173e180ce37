"""Built-in model families; each module exposes a config dataclass and ``init`` / ``from_params``."""
