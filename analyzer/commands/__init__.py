"""One module per ``perfsweep`` sub-command; each exposes ``register(app)``."""
