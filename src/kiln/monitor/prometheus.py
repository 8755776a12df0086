"""A Prometheus text endpoint for the latest metric record (rank 0, while training).

`GET /metrics` answers with one gauge per numeric key, `kiln_<key>`, labelled with the run name;
per-rank lists (`*_ranks`) become one sample per rank with a `rank` label. The text is written by
prometheus-client when it is installed, else by the few lines below (the text format is small:
https://prometheus.io/docs/instrumenting/exposition_formats/). The server is the standard
library's, bound to 127.0.0.1 by default, in a daemon thread: a scrape never touches the device,
it reads the record the trainer already built at the last log step.
"""

from __future__ import annotations

import math
import re
import socket
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kiln.errors import ConfigError
from kiln.monitor.sink import MetricsSink

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metric_name(key: str) -> str:
    return "kiln_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def samples(record: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(metric name, labels, value) for every number in the record (bools and strings skipped)."""
    for key, value in record.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            yield metric_name(key), {}, float(value)
        elif key.endswith("_ranks") and isinstance(value, (list, tuple)):
            for rank, item in enumerate(value):
                if isinstance(item, (int, float)) and not isinstance(item, bool):
                    yield metric_name(key.removesuffix("_ranks")), {"rank": str(rank)}, float(item)


def _escape(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def text_exposition(record: Mapping[str, Any], run: str) -> bytes:
    """Prometheus text format 0.0.4 without prometheus-client."""
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in samples(record):
        by_name.setdefault(name, []).append(({"run": run, **labels}, value))
    lines = []
    for name, rows in by_name.items():
        lines += [f"# HELP {name} kiln metric record key", f"# TYPE {name} gauge"]
        for labels, value in rows:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {_number(value)}")
    return ("\n".join(lines) + "\n").encode()


def client_exposition(record: Mapping[str, Any], run: str) -> bytes | None:
    """The same text through prometheus-client, or None when it is not installed."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import GaugeMetricFamily
    except ImportError:
        return None

    class RecordCollector:
        def collect(self):
            families: dict[str, GaugeMetricFamily] = {}
            for name, labels, value in samples(record):
                family = families.get(name)
                if family is None:
                    family = families[name] = GaugeMetricFamily(name, "kiln metric record key",
                                                                labels=["run", *labels])
                family.add_metric([run, *labels.values()], value)
            yield from families.values()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RecordCollector())
    return generate_latest(registry)


def check_bindable(host: str, port: int) -> None:
    """Bad input before any work: an address that does not resolve or a port already taken."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError("metrics.prometheus_host", f"{host!r} does not resolve ({exc})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ConfigError("metrics.prometheus_port", f"cannot listen on {host}:{port} ({exc.strerror}); "
                              "choose another port or 0 for a free one") from None


class PrometheusSink(MetricsSink):
    """Serves the latest record at http://HOST:PORT/metrics until closed."""

    def __init__(self, host: str, port: int, run: str) -> None:
        self.run = run
        self._record: dict[str, Any] = {}
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served")
                    return
                body = sink.exposition()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # scrapes every few seconds: keep the console quiet
                return None

        check_bindable(host, port)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("KilnMetricsServer", (ThreadingHTTPServer,), {"address_family": family,
                                                                         "daemon_threads": True})
        self._server = server_class((host, port), Handler)
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="kiln-prometheus", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def log(self, record: Mapping[str, Any]) -> None:
        with self._lock:
            self._record = dict(record)

    def exposition(self) -> bytes:
        with self._lock:
            record = dict(self._record)
        body = client_exposition(record, self.run)
        return body if body is not None else text_exposition(record, self.run)

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._thread = None
