"""A Locust worker process for perfsweep: ``python -m analyzer.load.worker --master-host H``.

Started by ``LocustLoadGenerator`` (``--workers N``) or by hand on other machines
(``perfsweep load --worker --master-host H``). It answers the controller's ``ps_request``
messages: ``configure`` (adopt the level's ``EngineConfig``) and ``tick`` (send this process's
recorder delta: encoded HDR histograms, counts, CPU). It exits when the master quits.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from analyzer.load._gevent import freeze_heap  # (isort: skip) patch first
from locust.env import Environment

from analyzer.load.context import EngineConfig, ProcessContext, attach_context
from analyzer.load.users import USER_CLASSES


def run_worker(master_host: str, master_port: int, index: int = 0) -> None:
    """Connect to the master and serve until it quits."""
    env = Environment(user_classes=list(USER_CLASSES))
    ctx = ProcessContext(index)
    attach_context(env, ctx)
    runner = env.create_worker_runner(master_host, master_port)
    freeze_heap()

    def on_request(environment: Environment, msg: Any, **_: Any) -> None:
        data = msg.data
        reply: dict[str, Any] = {"seq": data["seq"]}
        if data["kind"] == "configure":
            ctx.process_index = int(data.get("index", ctx.process_index))
            try:
                ctx.configure(EngineConfig.from_dict(data["config"]))
            except Exception as exc:  # reported to the controller, which raises TargetError
                reply["error"] = f"{type(exc).__name__}: {exc}"
        elif data["kind"] == "tick":
            reply["tick"] = ctx.recorder.take_tick()
        elif data["kind"] == "stop_sending":
            ctx.stop_sending()
        runner.send_message("ps_reply", reply)

    runner.register_message("ps_request", on_request)
    # Only now can this worker take the controller's requests: say so (DistributedBackend
    # sends none before).
    runner.send_message("ps_ready", {})
    try:
        runner.greenlet.join()
    finally:
        ctx.close()


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master-host", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=5557)
    parser.add_argument("--index", type=int, default=0, help="distinct per worker (seeds)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    run_worker(args.master_host, args.master_port, args.index)


if __name__ == "__main__":
    main()
