"""perfsweep: find the dynamic-batching config that serves the most traffic within a latency goal."""

import os

__version__ = "0.1.0"

# gRPC's fork handlers off, before anything imports grpc (its C core reads this once): the
# managed servers and Locust processes are forked with a preexec_fn, and a fork while a gRPC
# client thread is inside gRPC aborted the child (SIGABRT between fork and exec; 2 of 200
# forks beside four busy channels). Children exec at once and never use the parent's gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
