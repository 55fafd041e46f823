"""``--cache-config`` as ``tritonserver`` reads it, on ``python -m reference_server`` and
``perfsweep serve``.

The error cases mirror what the real Triton 2.51 of the wheel does with the same flag values
(probed by hand; its exit status is 1 where ours is 2, "bad input"): the format message for a
value without ``<setting>=<value>``, "No cache specified" for an empty name, one cache only,
``size`` required, and ``--response-cache-byte-size`` refused beside ``--cache-config``.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from reference_server.__main__ import main
from reference_server.app import ServerOptions, ServerThread
from reference_server.core.cache import (
    CacheConfigError,
    parse_cache_config,
    resolve_cache_size,
)
from tests.core.conftest import identity_config, write_model
from tests.server.test_serve_cli import FREE_PORTS, finish, perfsweep
from tests.support.real_triton import TritonInstall
from tests.support.servers import wait_until

CACHED = "response_cache { enable: true }"


def test_local_size_sets_the_cache_size() -> None:
    assert resolve_cache_size(0, ["local,size=1048576"]) == 1048576


def test_a_repeated_setting_keeps_the_last_value_and_other_settings_are_ignored() -> None:
    config = parse_cache_config(["local,size=2000", "local,size=300", "local,shards=4"])
    assert config is not None
    assert config.name == "local"
    assert config.size_bytes == 300
    assert dict(config.settings) == {"size": "300", "shards": "4"}


def test_no_flag_means_the_cache_size_flag_decides() -> None:
    assert parse_cache_config([]) is None
    assert resolve_cache_size(4096, []) == 4096
    assert resolve_cache_size(0, []) == 0


@pytest.mark.parametrize(
    ("values", "cache_size", "message"),
    [
        (["local"], 0, "No cache specified. --cache-config option format is"),
        (["size=100"], 0, "No cache specified. --cache-config option format is"),
        (["local,size"], 0, "format is '<cache name>,<setting>=<value>'. Got local,size"),
        (["local,size="], 0, "format is '<cache name>,<setting>=<value>'. Got local,size="),
        (["local,=5"], 0, "format is '<cache name>,<setting>=<value>'. Got local,=5"),
        ([",size=1"], 0, "No cache specified. --cache-config option format is"),
        (["local,size=10", "redis,host=h"], 0, "only a single cache is currently supported"),
        (["redis,host=h"], 0, "unable to find cache 'redis'"),
        (["local,bogus=3"], 0, "config didn't contain a valid 'size' field"),
        (["local,Size=3"], 0, "config didn't contain a valid 'size' field"),
        (["local,size=abc"], 0, "size 'abc' is not a positive whole number of bytes"),
        (["local,size=-5"], 0, "size '-5' is not a positive whole number"),
        (["local,size=0"], 0, "size '0' is not a positive whole number"),
        # Triton reads "100,size=200" as one value of the setting size (split at the first "=").
        (["local,size=100,size=200"], 0, "size '100,size=200' is not a positive whole number"),
        (["local,size=100"], 10, "Incompatible flags --cache-size and --cache-config"),
        ([], -1, "--cache-size -1 must be a number of bytes >= 0"),
    ],
)
def test_bad_cache_flags_are_refused_with_what_to_pass(
    values: list[str], cache_size: int, message: str
) -> None:
    with pytest.raises(CacheConfigError) as caught:
        ServerOptions(cache_size_bytes=cache_size, cache_config=tuple(values))
    assert message in caught.value.message
    assert caught.value.code.name == "INVALID_ARG"


def test_python_m_reference_server_exits_2_with_the_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["--cache-config", "local,size=10", "--response-cache-byte-size", "10"])
    assert code == 2
    assert "Incompatible flags --cache-size and --cache-config" in capsys.readouterr().err


@pytest.mark.usefixtures("serves")
def test_a_server_started_with_cache_config_answers_a_repeat_from_the_cache(
    tmp_path: Path,
) -> None:
    write_model(tmp_path, "c", identity_config("c", CACHED))
    options = ServerOptions(
        model_repositories=(tmp_path,), models=("c",), cache_config=("local,size=1048576",)
    )
    with ServerThread(options) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            for _ in range(3):
                tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
                tensor.set_data_from_numpy(_ones())
                client.infer("c", [tensor])
            stats = client.get_inference_statistics("c")["model_stats"][0]
        finally:
            client.close()
    assert stats["inference_stats"]["cache_hit"]["count"] == 2
    assert stats["inference_stats"]["cache_miss"]["count"] == 1


@pytest.mark.usefixtures("spawns")
def test_perfsweep_serve_passes_cache_config_to_the_server(tmp_path: Path) -> None:
    write_model(tmp_path, "c", identity_config("c", CACHED))
    process = perfsweep(
        tmp_path / "perfsweep.log",
        "serve",
        "--model-repository",
        str(tmp_path),
        "--cache-config",
        "local,size=1048576",
        *FREE_PORTS,
    )
    try:
        addresses = process.wait_ready(timeout_s=120)
        client = httpclient.InferenceServerClient(addresses.http_url)
        try:
            for _ in range(2):
                tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
                tensor.set_data_from_numpy(_ones())
                client.infer("c", [tensor])

            def hits() -> int:
                doc = client.get_inference_statistics("c")["model_stats"][0]
                return int(doc["inference_stats"]["cache_hit"]["count"])

            wait_until(lambda: hits() == 1, timeout_s=10, what="one cache hit")
        finally:
            client.close()
    finally:
        process.proc.send_signal(signal.SIGTERM)
        code, err = finish(process)
    assert code == 0, err


@pytest.mark.usefixtures("spawns")
def test_perfsweep_serve_refuses_a_bad_cache_config_with_exit_2(tmp_path: Path) -> None:
    process = perfsweep(
        tmp_path / "perfsweep.log", "serve", "--cache-config", "local,size=abc", *FREE_PORTS
    )
    code, err = finish(process)
    assert code == 2, err
    assert "size 'abc' is not a positive whole number of bytes" in err


#: (--cache-config values, a message fragment both servers print for them).
SAME_AS_TRITON = [
    (["local"], "No cache specified. --cache-config option format is"),
    ([",size=1"], "No cache specified. --cache-config option format is"),
    (["local,size"], "--cache-config option format is '<cache name>,<setting>=<value>'"),
    (["local,=5"], "--cache-config option format is '<cache name>,<setting>=<value>'"),
    (["local,size=10", "redis,host=h"], "only a single cache is currently supported"),
    (["local,bogus=3"], "config didn't contain a valid 'size' field"),
]


@pytest.mark.triton
@pytest.mark.parametrize(("values", "fragment"), SAME_AS_TRITON)
def test_tritonserver_refuses_the_same_values_with_the_same_words(
    triton_install: TritonInstall, tmp_path: Path, values: list[str], fragment: str
) -> None:
    (tmp_path / "repo").mkdir()
    done = subprocess.run(
        [
            str(triton_install.server_bin),
            f"--model-repository={tmp_path / 'repo'}",
            f"--cache-directory={triton_install.server_bin.parent.parent / 'caches'}",
            "--allow-http=false",
            "--allow-grpc=false",
            "--allow-metrics=false",
            *(f"--cache-config={v}" for v in values),
        ],
        env=triton_install.environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert fragment in done.stdout + done.stderr
    with pytest.raises(CacheConfigError) as caught:
        ServerOptions(cache_config=tuple(values))
    assert fragment in caught.value.message


def _ones() -> np.ndarray:
    return np.ones((1, 4), dtype=np.float32)
