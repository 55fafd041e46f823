"""A load with its inputs in system shared memory (scenario ``[input] shared_memory = "system"``).

The child (``python -m tests.load.test_shm_load PROTOCOL``) serves the bundled accumulator (its
``OUTPUT`` is the running sum of a sequence's inputs, so an answer shows what the server read)
and loads it closed loop with the inputs in one registered region per generator process. It
watches the wire (HTTP: the bytes of every request; gRPC: tritonclient's ``infer`` call), asks
the server for its shared-memory status during the load, and checks /dev/shm afterwards. The
tests: no request carries tensor data, the region was registered during the load, each START
answer equals the input the request's region offset holds, and the segment is gone after.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.load.child import run_module


@pytest.fixture(scope="module", params=["http", "grpc"])
def answer(request: pytest.FixtureRequest, spawns: None) -> dict[str, Any]:
    return run_module("tests.load.test_shm_load", request.param, timeout_s=240.0)


def test_requests_name_the_region_and_carry_no_tensor_data(answer: dict[str, Any]) -> None:
    result = answer["result"]
    assert result["error_count"] == 0, result["errors"]
    assert answer["sent"] > 20
    assert answer["with_data"] == 0
    assert answer["regions_seen"] == [answer["region"]]


def test_the_answers_are_the_values_in_the_region(answer: dict[str, Any]) -> None:
    checked = answer["starts"]
    assert len(checked) >= 3
    for expected, output in checked:
        assert output == expected


def test_the_segment_is_gone_after_the_load(answer: dict[str, Any]) -> None:
    assert answer["segment_during"] is True
    assert answer["segment_after"] is False
    assert answer["status_after"] == []


# ---- child side ---------------------------------------------------------------------------------


def main(protocol: str) -> None:
    """Child side: serve the accumulator, load it with shared-memory inputs, print what was seen."""
    import tritonclient.http as httpclient

    from analyzer.config.scenario import load_scenario
    from analyzer.load import LocustLoadGenerator
    from analyzer.load.engine import engine_options
    from analyzer.measure.specs import LoadMode, LoadSpec
    from reference_server.zoo.accumulator import accumulator_config, make_repository
    from tests.load.refserver import RefServer

    repo = Path(tempfile.mkdtemp(prefix="perfsweep-shm-"))
    make_repository(repo, accumulator_config("acc"))
    scenario = load_scenario(
        None, {"model.protocol": protocol, "input.shared_memory": "system"}, env={}
    )
    seen: dict[str, Any] = {"sent": 0, "with_data": 0, "starts": [], "regions": set()}
    holder: dict[str, Any] = {}

    def value_at(offset: int) -> int:
        shm = holder["ctx"].shm
        for index in range(len(shm)):
            place = shm.places(index)[0]
            if place.offset == offset:
                return int(shm.read(index, place.name).reshape(-1)[0])
        raise KeyError(offset)

    if protocol == "http":
        from analyzer.load.http_clients import RawHttpInferClient

        exchange = RawHttpInferClient.exchange

        def watched(self: Any, request: bytes) -> Any:
            status, headers, data = exchange(self, request)
            head, _, body = request.partition(b"\r\n\r\n")
            if b"Inference-Header-Content-Length" in head:
                seen["with_data"] += 1
            header = json.loads(body)
            params = header["inputs"][0]["parameters"]
            seen["sent"] += 1
            if header["parameters"]["sequence_start"] and status == 200:
                length = headers.get("inference-header-content-length")
                result = httpclient.InferenceServerClient.parse_response_body(
                    data, header_length=int(length) if length else None
                )
                output = int(result.as_numpy("OUTPUT").reshape(-1)[0])
                seen["starts"].append((value_at(params.get("shared_memory_offset", 0)), output))
            return status, headers, data

        RawHttpInferClient.exchange = watched  # type: ignore[method-assign]
    else:
        import tritonclient.grpc as grpcclient

        infer = grpcclient.InferenceServerClient.infer

        def watched_grpc(self: Any, model: str, inputs: list[Any], **kwargs: Any) -> Any:
            tensor = inputs[0]
            if tensor._raw_content is not None:
                seen["with_data"] += 1
            params = tensor._input.parameters  # a protobuf map: reading a key would add it
            offset = (
                params["shared_memory_offset"].int64_param
                if "shared_memory_offset" in params
                else 0
            )
            result = infer(self, model, inputs, **kwargs)
            seen["sent"] += 1
            if kwargs.get("sequence_start"):
                output = int(result.as_numpy("OUTPUT").reshape(-1)[0])
                seen["starts"].append((value_at(offset), output))
            return result

        grpcclient.InferenceServerClient.infer = watched_grpc  # type: ignore[method-assign]

    answer: dict[str, Any] = {}
    with RefServer(repo, ("acc",)) as srv:
        status_client = httpclient.InferenceServerClient(srv.http_url)

        def on_window(*_: Any) -> None:
            for region in status_client.get_system_shared_memory_status():
                seen["regions"].add(region["name"])
            shm = holder["ctx"].shm
            answer["segment_during"] = os.path.exists(f"/dev/shm{shm.key}")

        options = engine_options(
            scenario,
            f"http://{srv.http_url}",
            "acc",
            grpc_url=srv.grpc_url,
            on_window=on_window,
            scrape_server=False,
        )
        with LocustLoadGenerator(options) as generator:
            backend = generator._ensure_backend()
            holder["ctx"] = backend.ctx  # type: ignore[attr-defined]
            spec = LoadSpec(
                LoadMode.CONCURRENCY,
                4,
                warmup_s=0.2,
                window_s=0.6,
                max_windows=2,
                stable_windows=2,
                seed=1,
            )
            m = generator.measure(spec)
            shm = holder["ctx"].shm
            answer["region"], key = shm.region_name, shm.key
        answer["segment_after"] = os.path.exists(f"/dev/shm{key}")
        answer["status_after"] = [
            r["name"] for r in status_client.get_system_shared_memory_status()
        ]
        status_client.close()
    answer.update(
        result=m.to_dict(),
        sent=seen["sent"],
        with_data=seen["with_data"],
        starts=seen["starts"],
        regions_seen=sorted(seen["regions"]),
    )
    print(json.dumps(answer, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
