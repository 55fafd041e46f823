"""The locustfile ``perfsweep ui`` runs for a generative model: token-streaming users, load
shapes and the dashboard.

Run by ``perfsweep ui`` in place of ``locustfile.py`` when the model streams tokens (a
``--protocol`` stream was given, or the model is decoupled), so that the form offers only users
the model can serve. The users speak the form's ``--stream-protocol`` with its
``--input-tokens`` / ``--output-tokens``; the Server tab adds TTFT, ITL, tokens/s and goodput.
A plain ``locust -f`` runs it too.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
from locust import events

from analyzer.load.web.extension import install
from analyzer.load.web.options import add_arguments
from analyzer.load.web.shapes import DiurnalShape, RampShape, SpikeShape, SteadyShape
from analyzer.load.web.users import TritonStreamOpenLoopUser, TritonStreamUser

__all__ = [
    "DiurnalShape",
    "RampShape",
    "SpikeShape",
    "SteadyShape",
    "TritonStreamOpenLoopUser",
    "TritonStreamUser",
]

events.init_command_line_parser.add_listener(add_arguments)
events.init.add_listener(install)
