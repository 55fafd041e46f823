"""The locustfile ``perfsweep ui`` runs: perfsweep's Triton users, load shapes and dashboard.

Run by ``perfsweep ui`` as ``python -m locust -f <this file> --class-picker ...``. Users and shapes
are picked in the web form; perfsweep's options (``--triton-model``, ``--rate-per-user``, ...)
appear under "Custom parameters". ``scenarios/locustfile.py`` is the same without the shapes, for
a plain ``locust -f``. A generative model gets ``stream_locustfile.py`` instead (its users stream
tokens).
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
from locust import events

from analyzer.load.web.extension import install
from analyzer.load.web.options import add_arguments
from analyzer.load.web.shapes import DiurnalShape, RampShape, SpikeShape, SteadyShape
from analyzer.load.web.users import (
    TritonGrpcOpenLoopUser,
    TritonGrpcUser,
    TritonHttpOpenLoopUser,
    TritonHttpUser,
)

__all__ = [
    "DiurnalShape",
    "RampShape",
    "SpikeShape",
    "SteadyShape",
    "TritonGrpcOpenLoopUser",
    "TritonGrpcUser",
    "TritonHttpOpenLoopUser",
    "TritonHttpUser",
]

events.init_command_line_parser.add_listener(add_arguments)
events.init.add_listener(install)
