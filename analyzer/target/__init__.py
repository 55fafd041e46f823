"""Layer 5, target: the server under test.

The ``Target`` protocol and how a config is pushed (``protocol``), the managed reference server
(``managed``), a server at ``--url`` (``remote``) and its leases when workers share it
(``leases``), a managed real Triton (``triton``), which target a scenario describes
(``factory``), when the server is dead (``liveness``), the supervised child process
(``supervise``), the HTTP seam (``transport``) and the server's own statistics
(``server_stats``). Imports ``rundir`` and the layers below it.
"""
