"""jaxspec's version (read by the package's ``__init__``, the build and the policy's on-disk cost store)."""

__version__ = "0.1.0"
