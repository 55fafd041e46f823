"""Tests of the Locust measurement engine and ``perfsweep load`` (run the engine in child processes)."""
