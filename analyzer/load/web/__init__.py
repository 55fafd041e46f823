"""``perfsweep ui``: Locust's web dashboard wired to a Triton-compatible target.

Modules (only ``users``, ``shapes``, ``extension`` and the locustfiles import locust/gevent)::

    options     perfsweep's custom Locust arguments, target settings, exposure rule (pure)
    profiles    load curves over time: steady, ramp, spike, diurnal (pure)
    live        the Server tab's numbers: exact client window, server deltas, config form (pure)
    users       Triton users (HTTP/gRPC, closed/open loop) configured from Locust's form
    shapes      LoadTestShape wrappers of ``profiles``
    extension   the init listener: Server tab, /perfsweep/* routes, login, tick collection
    locustfile  what ``perfsweep ui`` runs (users + shapes + listeners)
    stream_locustfile  the same for a generative model (token-streaming users)
    launcher    ``UiOptions`` and ``run_ui``: managed server + Locust master/worker processes

Importing this package patches nothing.
"""
