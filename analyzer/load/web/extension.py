"""Locust web UI extension: the "Server" tab, its JSON routes, the config form and the login.

``install`` is an ``init`` event listener (registered by the locustfiles). On every process it
makes the exact recorder reach the dashboard: a worker pushes its recorder delta to the master
once a second (``perfsweep_tick`` message); the process with the web UI merges them (plus its
own users' when it runs them) into a :class:`~analyzer.load.web.live.ClientWindow`, scrapes the
target's statistics and metrics into a :class:`~analyzer.load.web.live.ServerWindow`, and serves:

* ``GET /perfsweep/server``: the dashboard document (``live.dashboard``);
* ``GET /perfsweep/config``, ``POST /perfsweep/config``: the model's batching knobs, read and
  applied with the repository API (``POST /v2/repository/models/<m>/load`` with a config
  override, as the sweep does) while load runs; a generative model's engine knobs
  (``max_num_seqs``, ``max_num_batched_tokens``, chunked prefill, the memory share, instances)
  the same way, its engine file (vLLM's ``1/model.json``) sent beside the config as a sweep's
  trial sends it (:class:`~analyzer.config.pipeline.Tuned`);
* ``/perfsweep/static/*``: the panel script and style injected into Locust's page.

Locust's own UI shows a "Server" tab (``extended_tabs``) whose table lists the headline numbers;
the injected script adds charts, the batch-size histogram and the config form above that table.

Safety: the dashboard binds 127.0.0.1 unless told otherwise; on any other address it refuses to
start without ``--web-login`` and a password from ``PERFSWEEP_UI_PASSWORD``.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import collections
import hmac
import json
import logging
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from flask import Blueprint, Response, jsonify, redirect, request, send_from_directory, session
from flask_login import UserMixin, login_user
from jinja2 import ChoiceLoader, DictLoader
from locust.env import Environment
from locust.html import DEFAULT_BUILD_PATH
from locust.runners import LocalRunner, MasterRunner, WorkerRunner
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import EngineKnobs, Knobs  # where they live (no optuna import)
from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.config.pipeline import ENGINE_FILE_KEY, Tuned, engine_of
from analyzer.errors import InputError, PerfsweepError
from analyzer.load.recorder import Tick
from analyzer.load.web.live import (
    HISTORY_POINTS,
    ClientWindow,
    Point,
    ServerWindow,
    TokenGoals,
    dashboard,
    parse_config_request,
    parse_engine_request,
    table_rows,
    tick_point,
)
from analyzer.load.web.options import (
    TargetSettings,
    access_from_env,
    exposure_problem,
    login_from_env,
    request_problem,
)
from analyzer.load.web.users import live_state
from analyzer.target.protocol import ConfigRejectedError, untunable_reason
from analyzer.target.remote import RemoteTarget
from analyzer.target.server_stats import ServerScraper, http_stats_source
from analyzer.target.transport import UrllibTransport

log = logging.getLogger(__name__)

TICK_MESSAGE = "perfsweep_tick"
TAB_KEY = "server"
STATIC_DIR = Path(__file__).parent / "static"
#: How often (seconds) the dashboard re-reads the model config (it may change from elsewhere).
CONFIG_REFRESH_S = 5.0
#: The line ``perfsweep ui`` (and tests) read to learn the dashboard's address.
READY_PREFIX = "perfsweep ui: dashboard at "


class Dashboard:
    """The web UI process's live view: collects ticks, scrapes the server, applies configs.

    Args:
        environment: Locust environment (its runner and host are read on every step).
        clock: Monotonic clock (tests pass a fake one).
    """

    def __init__(self, environment: Environment, clock: Callable[[], float] = time.monotonic):
        self.environment = environment
        self.clock = clock
        self.client = ClientWindow()
        self.server = ServerWindow()
        self.history: collections.deque[Point] = collections.deque(maxlen=HISTORY_POINTS)
        self.config: dict[str, Any] | None = None
        self.errors: dict[str, str] = {}
        self._worker_ticks: list[dict[str, Any]] = []
        self._scraper: ServerScraper | None = None
        self._scraper_key: tuple[str, str, str] | None = None
        self._config_read_at = -1e9
        #: A vLLM engine's settings file as last applied (or as found: ``--perfsweep-engine-file``);
        #: None while unknown (Triton's API does not serve a model's files).
        self.engine_file: dict[str, Any] | None = _engine_file_option(environment)
        self.doc: dict[str, Any] = self._document(self.clock())

    # ---- inputs -----------------------------------------------------------------------------

    def on_worker_tick(self, environment: Environment, msg: Any, **_: Any) -> None:
        """A worker's recorder delta (``perfsweep_tick`` message)."""
        self._worker_ticks.append(msg.data)

    def reset(self, **_: Any) -> None:
        """A new test (or Locust's "reset stats"): the exact numbers start afresh too."""
        self.client.reset()
        self.history.clear()

    # ---- the once-a-second step -------------------------------------------------------------

    def settings(self) -> tuple[TargetSettings, str] | None:
        """Target settings and model name, or None (recorded in ``errors``) when unknown."""
        try:
            settings = live_state(self.environment).settings()
            model = live_state(self.environment).model(settings)
        except (ValueError, PerfsweepError) as exc:
            self.errors["target"] = str(exc)
            return None
        self.errors.pop("target", None)
        return settings, model

    def step(self) -> None:
        """Collect one second of ticks and one server snapshot; rebuild the document."""
        now = self.clock()
        raw, self._worker_ticks = self._worker_ticks, []
        if isinstance(self.environment.runner, LocalRunner):
            raw.append(live_state(self.environment).recorder.take_tick())
        tick = Tick.merge(raw) if raw else Tick()
        self.client.add(now, tick)
        view = None
        target = self.settings()
        if target is not None:
            settings, model = target
            scraper = self._scraper_for(settings, model)
            scraper.errors.clear()  # show this step's scrape problems, not stale ones
            view = self.server.add(now, scraper.snapshot())
            for key in [k for k in self.errors if k.startswith("server ")]:
                del self.errors[key]
            self.errors.update({f"server {k}": v for k, v in scraper.errors.items()})
            if now - self._config_read_at >= CONFIG_REFRESH_S:
                self.refresh_config(settings, model)
        runner = self.environment.runner
        if tick.completed or (runner is not None and runner.user_count > 0):
            self.history.append(tick_point(now, tick, view))
        self.doc = self._document(now)

    def _scraper_for(self, settings: TargetSettings, model: str) -> ServerScraper:
        key = (settings.http_url, model, settings.metrics_url)
        if self._scraper is None or key != self._scraper_key:
            explicit = bool(getattr(self.environment.parsed_options, "metrics_url", ""))
            transport = UrllibTransport(access_from_env())
            self._scraper = ServerScraper(
                model,
                http_stats_source(settings.http_url, model, transport=transport),
                settings.metrics_url,
                metrics_optional=not explicit,  # a guessed port that fails is dropped silently
                transport=transport,
            )
            self._scraper_key = key
            self.server = ServerWindow()
        return self._scraper

    def _target(self, settings: TargetSettings, model: str) -> RemoteTarget:
        return RemoteTarget(settings.http_url, model, access=access_from_env())

    def _tuned(self, config: mc.ModelConfig) -> Tuned | None:
        """A generative model's engine and what sets it; None for a model Triton batches."""
        engine = engine_of(config)
        if engine is None:
            return None
        return Tuned(config, engine=engine, engine_file=self.engine_file)

    def _config_doc(self, config: mc.ModelConfig) -> dict[str, Any]:
        tuned = self._tuned(config)
        if tuned is None:
            return knobs_of(config).to_dict()
        known = tuned.engine == "tensorrtllm" or self.engine_file is not None
        return {**tuned.knobs().to_dict(), "engine_name": tuned.engine, "settings_known": known}

    def refresh_config(self, settings: TargetSettings, model: str) -> None:
        """Re-read the model's knobs from the server (errors go to ``errors["config"]``)."""
        self._config_read_at = self.clock()
        try:
            self.config = self._config_doc(self._target(settings, model).model_config())
            self.errors.pop("config", None)
        except PerfsweepError as exc:
            self.errors["config"] = str(exc)

    def apply_config(self, posted: Any) -> dict[str, Any]:
        """Apply posted knobs with the repository API; return the config the server now reports.

        Raises:
            InputError: the post is invalid, the model is one perfsweep must not tune (an
                ensemble or sequence-batched: nothing is loaded), or the server refused it.
            TargetError: the server could not be reached or the model did not come back.
        """
        target_settings = self.settings()
        if target_settings is None:
            raise InputError(self.errors.get("target", "no target"))
        settings, model = target_settings
        target = self._target(settings, model)
        base = target.model_config()
        tuned = self._tuned(base)
        if tuned is not None:
            return self._apply_engine(target, tuned, posted, settings, model)
        reason = untunable_reason(base)  # dynamic_batching would erase its scheduling (a oneof)
        if reason:
            raise InputError(reason)
        wanted = Knobs.from_dict(parse_config_request(posted, knobs_of(base).to_dict()))
        try:
            config = apply_knobs(base, wanted)
        except ValueError as exc:  # knobs this model's config cannot take
            raise InputError(str(exc)) from exc
        try:
            target.load_config(config)
        except ConfigRejectedError as exc:
            raise InputError(str(exc)) from exc
        log.info("perfsweep: applied %s to %s", wanted.label(), model)
        self.refresh_config(settings, model)
        self.doc = self._document(self.clock())
        return self.config or {}

    def _apply_engine(
        self,
        target: RemoteTarget,
        tuned: Tuned,
        posted: Any,
        settings: TargetSettings,
        model: str,
    ) -> dict[str, Any]:
        """A generative model's engine knobs: its config (instances; TensorRT-LLM's parameters)
        and its engine file (vLLM's), loaded together as a sweep's trial is."""
        if tuned.engine == "vllm" and self.engine_file is None:
            # Triton's API serves no model files; a model.json of the knobs alone would drop
            # the keys it does not tune (the model's path), and the model would not load.
            raise InputError(
                f"the engine settings of {model!r} (its 1/model.json) cannot be read from the "
                "server, and a file of the knobs alone would drop its other keys (the model's "
                "path): open the model on the managed server (perfsweep ui --model-repository "
                "DIR --model NAME), or give the file to Locust with --perfsweep-engine-file JSON"
            )
        current = tuned.knobs().to_dict()
        try:
            wanted = EngineKnobs.from_dict(parse_engine_request(posted, current))
            (config,) = tuned.configs(wanted)
        except ValueError as exc:  # knobs this engine cannot take
            raise InputError(str(exc)) from exc
        files = tuned.files(wanted)
        try:
            target.load_config(config, files=files or None)
        except ConfigRejectedError as exc:
            raise InputError(str(exc)) from exc
        if files:
            self.engine_file = json.loads(files[ENGINE_FILE_KEY])
        log.info("perfsweep: applied %s to %s", wanted.label(), model)
        self.refresh_config(settings, model)
        self.doc = self._document(self.clock())
        return self.config or {}

    def _document(self, now: float) -> dict[str, Any]:
        runner = self.environment.runner
        state = live_state(self.environment)
        goals = None
        try:
            settings = state.settings()
            url, model = settings.http_url, state.known_model(settings)
            goals = TokenGoals(settings.ttft_p99_ms, settings.itl_p99_ms)
        except ValueError:
            url, model = "", ""
        return dashboard(
            now=now,
            model=model,
            target=url,
            state=runner.state if runner is not None else "missing",
            users=runner.user_count if runner is not None else 0,
            client=self.client,
            server=self.server,
            history=list(self.history),
            config=self.config,
            errors=self.errors,
            goals=goals,
        )

    def run(self, interval_s: float = 1.0) -> None:
        """Step forever (a greenlet); one failed step is logged and does not stop the loop."""
        while True:
            started = self.clock()
            try:
                self.step()
            except Exception:  # the dashboard must outlive a bad scrape
                log.exception("perfsweep dashboard step failed")
            gevent.sleep(max(0.05, interval_s - (self.clock() - started)))


def _engine_file_option(environment: Environment) -> dict[str, Any] | None:
    """``--perfsweep-engine-file`` (a generative model's settings as found), or None."""
    raw = getattr(environment.parsed_options, "perfsweep_engine_file", "") or ""
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        log.warning("perfsweep: --perfsweep-engine-file is not JSON; ignored")
        return None
    return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------------------------------
# Installation on Locust


def _push_ticks(environment: Environment, runner: WorkerRunner, interval_s: float = 1.0) -> None:
    state = live_state(environment)
    while True:
        gevent.sleep(interval_s)
        runner.send_message(TICK_MESSAGE, state.recorder.take_tick())


def _index_template() -> str:
    """Locust's index.html with the panel's container, style and script added."""
    html = (Path(DEFAULT_BUILD_PATH) / "index.html").read_text()
    extra = (
        '<div id="perfsweep-panel" hidden></div>\n'
        '<link rel="stylesheet" href="./perfsweep/static/panel.css">\n'
        '<script src="./perfsweep/static/panel.js"></script>\n'
    )
    return html.replace("</body>", extra + "</body>", 1)


class _LoginUser(UserMixin):
    def __init__(self, user_id: str) -> None:
        self.id = user_id


def _setup_login(web_ui: Any, credentials: tuple[str, str], bp: Blueprint) -> None:
    user, password = credentials
    web_ui.app.config["SECRET_KEY"] = secrets.token_hex(32)
    web_ui.auth_args = {"username_password_callback": "./perfsweep/login"}

    @web_ui.login_manager.user_loader
    def load_user(user_id: str) -> _LoginUser | None:
        return _LoginUser(user_id) if user_id == user else None

    @bp.route("/login", methods=["POST"])
    def login_submit() -> Any:
        given_user = request.form.get("username", "")
        given_password = request.form.get("password", "")
        ok_user = hmac.compare_digest(given_user.encode(), user.encode())
        ok_password = hmac.compare_digest(given_password.encode(), password.encode())
        if ok_user and ok_password:
            login_user(_LoginUser(user))
            return redirect("../")
        session["auth_error"] = "Invalid username or password"
        return redirect("../login")


def _check_exposure(web_ui: Any) -> tuple[str, str] | None:
    """Bind loopback by default; refuse other addresses without a login. Returns credentials."""
    credentials = login_from_env()
    if web_ui.host == "" and not web_ui.web_login:
        # Locust's default is every interface; perfsweep's is this machine only.
        web_ui.host = "127.0.0.1"
    problem = exposure_problem(web_ui.host, web_ui.web_login, credentials)
    if problem:
        log.error("perfsweep: %s", problem)
        sys.stderr.write(f"error: {problem}\n")
        sys.exit(2)
    return credentials if web_ui.web_login else None


def _announce(web_ui: Any, login_user_name: str | None) -> None:
    """Print the bound address once the server listens (``--web-port 0`` picks a free one)."""
    for _ in range(600):
        server = web_ui.server
        if server is not None and getattr(server, "socket", None) is not None:
            host = web_ui.host or "0.0.0.0"
            shown = f"[{host}]" if ":" in host else host
            line = f"{READY_PREFIX}http://{shown}:{server.server_port}/"
            if login_user_name:
                line += f" (login required: user {login_user_name!r})"
            else:
                line += " (no login: loopback only)"
            print(line, flush=True)
            return
        gevent.sleep(0.05)


def install(environment: Environment, runner: Any = None, web_ui: Any = None, **_: Any) -> None:
    """``init`` listener: wire the exact recorder, the Server tab, its routes and the login."""
    runner = runner or environment.runner
    if isinstance(runner, WorkerRunner):
        gevent.spawn(_push_ticks, environment, runner)
        return
    if web_ui is None:
        return  # headless: nothing to show
    credentials = _check_exposure(web_ui)
    if web_ui.userclass_picker_is_active:
        environment.shape_class = None  # the form's "Default" until a shape is picked

    board = Dashboard(environment)
    environment.perfsweep_dashboard = board  # type: ignore[attr-defined]
    if isinstance(runner, MasterRunner):
        runner.register_message(TICK_MESSAGE, board.on_worker_tick)
    environment.events.test_start.add_listener(board.reset)
    environment.events.reset_stats.add_listener(board.reset)

    _guard_requests(web_ui)
    # Under Locust's --web-base-path too, so the page's relative "./perfsweep/..." URLs resolve.
    base_path = getattr(environment.parsed_options, "web_base_path", "") or ""
    bp = _routes(board, web_ui, url_prefix=base_path.rstrip("/") + "/perfsweep")
    if credentials is not None:
        _setup_login(web_ui, credentials, bp)
    web_ui.app.register_blueprint(bp)
    _add_server_tab(web_ui, board)

    gevent.spawn(board.run)
    gevent.spawn(_announce, web_ui, credentials[0] if credentials else None)


def _guard_requests(web_ui: Any) -> None:
    """403 for other web pages' state changes and DNS-rebound hosts (``request_problem``)."""

    @web_ui.app.before_request
    def same_origin_only() -> Response | None:
        problem = request_problem(
            request.method, request.host, request.headers.get("Origin"), web_ui.host
        )
        return _json_error(problem, 403) if problem else None


def _routes(board: Dashboard, web_ui: Any, url_prefix: str) -> Blueprint:
    """``/perfsweep/server``, ``/perfsweep/config`` (GET/POST) and the panel's static files."""
    bp = Blueprint("perfsweep", __name__, url_prefix=url_prefix)
    auth = web_ui.auth_required_if_enabled

    @bp.route("/server")
    @auth
    def server_doc() -> Response:
        return jsonify(board.doc)

    @bp.route("/config", methods=["GET"])
    @auth
    def get_config() -> Response:
        target = board.settings()
        if target is not None:
            board.refresh_config(*target)
        if board.config is None:
            return _json_error(board.errors.get("config") or board.errors.get("target", ""), 503)
        return jsonify({"ok": True, "config": board.config})

    @bp.route("/config", methods=["POST"])
    @auth
    def post_config() -> Response:
        try:
            config = board.apply_config(request.get_json(force=True, silent=True))
        except InputError as exc:
            return _json_error(str(exc), 400)
        except PerfsweepError as exc:
            return _json_error(str(exc), 502)
        return jsonify({"ok": True, "config": config})

    @bp.route("/static/<path:name>")
    def static(name: str) -> Response:
        return send_from_directory(STATIC_DIR, name, max_age=0)

    return bp


def _add_server_tab(web_ui: Any, board: Dashboard) -> None:
    """The "Server" tab: Locust's native table (template args + ``extended_stats``) and the
    panel script injected into Locust's index.html."""
    app = web_ui.app
    if not app.template_folder or Path(app.template_folder) == Path(DEFAULT_BUILD_PATH):
        # Only Locust's own page gets the panel; a custom --build-path is left alone.
        app.jinja_env.loader = ChoiceLoader(
            [DictLoader({"index.html": _index_template()}), app.jinja_env.loader]
        )
    web_ui.template_args["extended_tabs"] = [{"title": "Server", "key": TAB_KEY}]
    web_ui.template_args["extended_tables"] = [
        {
            "key": TAB_KEY,
            "structure": [
                {"key": "metric", "title": "Server metric"},
                {"key": "value", "title": "Value"},
            ],
        }
    ]

    @app.after_request
    def add_server_rows(response: Response) -> Response:
        # /stats/requests is what Locust's page polls every 2 s: the tab's table rides along.
        if request.path.endswith("/stats/requests") and response.is_json:
            data = response.get_json()
            data["extended_stats"] = [{"key": TAB_KEY, "data": table_rows(board.doc)}]
            response.set_data(json.dumps(data))
        return response


def _json_error(message: str, status: int) -> Response:
    response = jsonify({"ok": False, "error": message})
    response.status_code = status
    return response
