"""perfsweep's load shapes (steady, ramp, spike, diurnal) for a plain Locust run.

Add this file after the locustfile and pick a shape in the form::

    locust -f scenarios/locustfile.py,scenarios/shapes.py --class-picker --host http://127.0.0.1:8000
"""

from analyzer.load.web.shapes import DiurnalShape, RampShape, SpikeShape, SteadyShape

__all__ = ["DiurnalShape", "RampShape", "SpikeShape", "SteadyShape"]
