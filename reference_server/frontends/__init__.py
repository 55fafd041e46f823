"""The protocols the server speaks: KServe v2 over HTTP/REST (``http``, its pure ``http_codec``)
and gRPC (``grpc``), with the tensor encodings both share (``wire``).

Frontends call :class:`reference_server.core.server.InferenceServer`; the core never imports
a frontend.
"""
