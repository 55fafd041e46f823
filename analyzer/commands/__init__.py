"""One module per ``perfsweep`` sub-command; each exposes ``register(app)``.

Layer 11 of ``analyzer`` (``docs/internals.md``), with ``cli.py``: the typer layer on top of
every other.
"""
