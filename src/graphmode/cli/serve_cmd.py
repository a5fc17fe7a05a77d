"""``graphmode serve``: the selector as an HTTP service (FastAPI on uvicorn)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from graphmode.cli.common import handle_errors

console = Console(stderr=True)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        host: Annotated[
            str | None, typer.Option("--host", help="Address to bind (default: settings, 127.0.0.1).")
        ] = None,
        port: Annotated[
            int | None, typer.Option("--port", min=1, max=65535, help="Port (default: settings, 8080).")
        ] = None,
        models_dir: Annotated[
            Path | None, typer.Option("--models-dir", help="Registry root (default: settings).")
        ] = None,
        model_id: Annotated[
            str | None,
            typer.Option("--model-id", help="Default model (default: the best match for this host)."),
        ] = None,
        workers: Annotated[
            int,
            typer.Option(
                "--workers",
                min=1,
                max=64,
                help="Worker processes. Each loads the models; /v1/reload reaches only the worker that "
                "answers it, so keep 1 unless you restart to reload.",
            ),
        ] = 1,
        log_level: Annotated[
            str, typer.Option("--log-level", help="uvicorn log level: critical, error, warning, info, debug.")
        ] = "info",
        access_log: Annotated[
            bool, typer.Option("--access-log/--no-access-log", help="Log every request (costs latency).")
        ] = False,
    ) -> None:
        """Serve recommendations over HTTP: POST /v1/recommend, /v1/models, /healthz, /metrics, /docs.

        Reload, retrain and jobs need GRAPHMODE_SERVICE__TOKEN (bearer); without it they answer 403.
        Slow clients are bounded (settings.service: header_timeout_s, body_timeout_s, keep_alive_s,
        max_header_bytes); SIGTERM stops a running retrain job's vLLM before the service exits.
        """
        with handle_errors():
            import uvicorn

            from graphmode.core.settings import load_settings
            from graphmode.selector import model_card

            s = load_settings()
            bind = host or s.service.host
            bind_port = port or s.service.port
            root = models_dir or s.selector.models_dir
            chosen = model_id or s.selector.model_id
            if chosen:
                model_card(chosen, root)  # a missing model is a clear error now, not a failed start-up
            if not _is_loopback(bind):
                console.print(
                    f"[bold yellow]warning:[/] binding {bind}: /v1/recommend, /v1/models and /metrics "
                    "answer anyone who can reach it (only reload/retrain/jobs need the token)",
                    highlight=False,
                )
            token = "configured" if s.service.token is not None else "not set: reload/retrain disabled"
            console.print(
                f"graphmode serve on http://{bind}:{bind_port} (models {root}, token {token}, "
                f"workers {workers}); docs at /docs",
                highlight=False,
            )
            from graphmode.service.server import uvicorn_config, uvicorn_options

            if workers == 1:
                from graphmode.service.app import create_app

                application = create_app(s, models_dir=root, model_id=chosen)
                config = uvicorn_config(
                    application, s, host=bind, port=bind_port, log_level=log_level, access_log=access_log
                )
                server = uvicorn.Server(config)
                server.run()
                if not server.started:  # as uvicorn.run: the app's start-up failed
                    raise SystemExit(3)
                return
            # Worker processes build their own app from the environment.
            os.environ["GRAPHMODE_SELECTOR__MODELS_DIR"] = str(root)
            if chosen:
                os.environ["GRAPHMODE_SELECTOR__MODEL_ID"] = chosen
            uvicorn.run(
                "graphmode.service.app:app_from_env",
                factory=True,
                host=bind,
                port=bind_port,
                workers=workers,
                log_level=log_level,
                access_log=access_log,
                **uvicorn_options(s),
            )
