"""perfsweep's Triton users for a plain Locust run, with the dashboard's "Server" tab.

::

    locust -f scenarios/locustfile.py --host http://127.0.0.1:8000
    locust -f scenarios/locustfile.py --host http://127.0.0.1:8000 TritonHttpOpenLoopUser \\
        --rate-per-user 20 --triton-model resnet50
    locust -f scenarios/locustfile.py,scenarios/shapes.py --class-picker --host http://127.0.0.1:8000

Without user class names every class runs (closed and open loop, HTTP and gRPC); gRPC users use
``--grpc-url`` or the HTTP port + 1 (Triton's layout). The web UI binds 127.0.0.1 unless
``--web-host`` and ``--web-login`` with ``PERFSWEEP_UI_PASSWORD`` say otherwise.
``perfsweep ui`` does all of this for you, and starts the reference server when no URL is given.
"""

from analyzer.load.web.locustfile import (
    TritonGrpcOpenLoopUser,
    TritonGrpcUser,
    TritonHttpOpenLoopUser,
    TritonHttpUser,
)

__all__ = ["TritonGrpcOpenLoopUser", "TritonGrpcUser", "TritonHttpOpenLoopUser", "TritonHttpUser"]
