"""Property test through the real threaded scheduler: random configs and arrival patterns.

Whatever the batching settings, every request is answered exactly once, with its own data, and
no execution exceeds max_batch_size; statistics add up.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_server.core.errors import ServerError
from reference_server.core.server import CoreOptions, InferenceServer
from reference_server.core.types import InferRequest
from tests.core.conftest import Collector, identity_config, write_model


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[str, int, list[tuple[int, int, float]]]:
    mbs = draw(st.integers(min_value=1, max_value=8))
    prefs = sorted(draw(st.sets(st.integers(min_value=1, max_value=mbs), max_size=2)))
    delay_us = draw(st.sampled_from([0, 200, 2000]))
    instances = draw(st.integers(min_value=1, max_value=2))
    levels = draw(st.sampled_from([0, 2]))
    ordering = levels == 0 and draw(st.booleans())
    db = f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} "
    if prefs:
        db += f"preferred_batch_size: {prefs} "
    if levels:
        db += f"priority_levels: {levels} default_priority_level: 1 "
    if ordering:
        db += "preserve_ordering: true "
    db += "}"
    extra = (
        db
        + f"\ninstance_group [{{ count: {instances} kind: KIND_CPU }}]\n"
        + 'parameters { key: "execute_delay_ms" value { string_value: "1" } }'
    )
    reqs = draw(
        st.lists(
            st.tuples(
                st.integers(min_value=1, max_value=mbs),  # batch size
                st.integers(min_value=0, max_value=3),  # priority
                st.sampled_from([0.0, 0.0, 0.0005, 0.002]),  # gap before sending
            ),
            min_size=1,
            max_size=24,
        )
    )
    return extra, mbs, reqs


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(scenarios())
@pytest.mark.usefixtures("takes_seconds")
def test_every_request_answered_once_with_its_own_data(
    scenario: tuple[str, int, list[tuple[int, int, float]]],
) -> None:
    extra, mbs, reqs = scenario
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_model(root, "p", identity_config("p", extra, max_batch_size=mbs))
        server = InferenceServer(
            CoreOptions(model_repositories=(root,), startup_models=("p",), gpu_ids=())
        )
        server.start()
        try:
            col = Collector()
            for i, (bs, priority, gap) in enumerate(reqs):
                if gap:
                    time.sleep(gap)  # the generated arrival schedule, not a sync wait
                data = np.arange(bs * 4, dtype=np.float32).reshape(bs, 4) + 1000 * i
                server.submit(
                    InferRequest("p", id=str(i), inputs={"INPUT0": data}, priority=priority),
                    col.callback(str(i)),
                )
            col.wait(len(reqs), timeout=30)
            for i, (bs, _, _) in enumerate(reqs):
                out = col.results[str(i)]
                assert not isinstance(out, ServerError), out
                expected = np.arange(bs * 4, dtype=np.float32).reshape(bs, 4) + 1000 * i
                np.testing.assert_array_equal(out.outputs["OUTPUT0"], expected)
                assert out.id == str(i)
            stats = server.model_statistics("p")["model_stats"][0]
            sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
            assert max(sizes) <= mbs
            assert sum(b * n for b, n in sizes.items()) == sum(bs for bs, _, _ in reqs)
            assert stats["inference_count"] == sum(bs for bs, _, _ in reqs)
            assert stats["inference_stats"]["success"]["count"] == len(reqs)
            assert sum(sizes.values()) == stats["execution_count"]
            if "preserve_ordering: true" in extra:
                assert col.order == [str(i) for i in range(len(reqs))]
        finally:
            server.stop()
