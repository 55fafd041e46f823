"""Child side of the payload tests: load a running server with the engine's payload options.

``python -m tests.load.payload_driver`` reads a JSON spec on stdin: ``url`` (HTTP host:port of a
server the test started), ``model``, ``options`` (the request data as
``InputOptions.to_dict`` writes it: ``unique_payloads``, ``repeat_ratio``, ``distribution`` as
``[{"shapes": ..., "weight": w}]``, ``shapes``, ``mode``, ``data_file``, ``batch_size``), ``level``
(``LoadSpec`` fields). It measures the level with ``LocustLoadGenerator`` and prints, as its last stdout line,
the measurement and ``wire``: the input shapes of every request this process's engine built,
decoded by the reference server's own HTTP codec (what the server reads from those bytes).
"""

from __future__ import annotations

import json
import sys


def _decoded_shapes(request: bytes, model: str) -> dict[str, list[int]]:
    """The inputs' shapes as the reference server parses this whole HTTP request."""
    from reference_server.frontends.http_codec import parse_infer_request, parse_json

    head, _, body = request.partition(b"\r\n\r\n")
    headers = dict(
        line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line
    )
    length = int(headers["Inference-Header-Content-Length"])
    parsed = parse_infer_request(
        model, "", parse_json(body[:length]), memoryview(body[length:]), has_header_length=True
    )
    return {name: list(tensor.shape) for name, tensor in parsed.inputs.items()}


def main() -> None:
    """Measure the level, then describe the requests the engine sent."""
    spec = json.loads(sys.stdin.read())
    from analyzer.load import EngineOptions, LocustLoadGenerator
    from analyzer.load.context import EngineConfig, ProcessContext
    from analyzer.load.inputs import InputOptions
    from analyzer.load.prepared import prepare_requests
    from analyzer.measure.specs import LoadMode, LoadSpec

    inputs = InputOptions.from_dict(spec.get("options", {}))
    options = EngineOptions(url=spec["url"], model=spec["model"], inputs=inputs)
    level = dict(spec["level"])
    level["mode"] = LoadMode(level["mode"])
    with LocustLoadGenerator(options) as generator:
        measurement = generator.measure(LoadSpec(**level))
        generator.drain(30.0)
    # The requests one process builds for this config: the bytes its users put on the wire.
    ctx = ProcessContext(0)
    ctx.configure(
        EngineConfig(
            protocol="http",
            url=options.url,
            model=options.model,
            mode=LoadMode.CONCURRENCY,
            seed=level.get("seed", 0),
            inputs=options.inputs,
        )
    )
    assert ctx.requests is not None and ctx.inputs is not None
    wire = [_decoded_shapes(request, options.model) for request in ctx.requests.items]
    answer = {
        "measurement": measurement.to_dict(),
        "wire": wire,
        "unique": ctx.inputs.unique_count,
        "rotation": len(ctx.inputs.payloads),
        "distinct_request_objects": len({id(r) for r in ctx.requests.items}),
        # Any client made from this InputSet (the dashboard's users too) takes these requests.
        "shared_by_clients": prepare_requests("http", options.url, ctx.inputs) is ctx.requests,
    }
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
