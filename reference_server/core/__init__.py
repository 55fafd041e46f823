"""What a model is and how the server holds it: the ``server`` facade the frontends call, the
loaded ``model`` runtime, the ``repository``, model ``config`` parsing and validation,
``stats`` and Prometheus metrics (``gpu`` for the nv_gpu_* families), the response ``cache``,
and the request ``types`` and ``errors`` every layer shares.
"""
