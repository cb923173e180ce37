"""Placement across devices and processes: the logical-axis sharding rules, meshes and placement
(``sharding``), and prompts shared across processes (``multihost``)."""
