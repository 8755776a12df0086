"""The Prometheus endpoint: scraped over loopback, both text writers, bad ports are bad input."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from kiln.config import ConfigError, MetricsConfig
from kiln.monitor import prometheus
from kiln.monitor.prometheus import PrometheusSink, check_bindable, text_exposition
from kiln.monitor.sinks import build_sinks

RECORD = {"step": 20, "loss": 1.5, "first_step": True, "note": "x", "step_ms_ranks": [10.0, 12.5],
          "stragglers": [1], "gpu_throttle_reasons": ["gpu_idle"], "grad_norm": float("nan")}


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


def _values(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.parametrize("writer", ["prometheus_client", "stdlib"])
def test_scrape_serves_the_latest_record(monkeypatch, writer):
    if writer == "prometheus_client":
        pytest.importorskip("prometheus_client")
    else:
        monkeypatch.setattr(prometheus, "client_exposition", lambda record, run: None)
    sink = PrometheusSink("127.0.0.1", 0, run="run-a")
    try:
        assert sink.url.startswith("http://127.0.0.1:")
        sink.log(RECORD)
        values = _values(_scrape(sink.url))
        assert values['kiln_step{run="run-a"}'] == 20
        assert values['kiln_loss{run="run-a"}'] == 1.5
        assert values['kiln_step_ms{rank="0",run="run-a"}' if writer == "prometheus_client"
                      else 'kiln_step_ms{run="run-a",rank="0"}'] == 10.0
        assert len([k for k in values if k.startswith("kiln_step_ms{")]) == 2
        assert not any(k.startswith(("kiln_first_step", "kiln_note", "kiln_stragglers", "kiln_gpu_throttle_reasons"))
                       for k in values)
        sink.log({"step": 30, "loss": 1.25})
        assert _values(_scrape(sink.url))['kiln_loss{run="run-a"}'] == 1.25
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(sink.url.replace("/metrics", "/nope"), timeout=30)
    finally:
        sink.close()
        sink.close()


def test_text_exposition_format():
    text = text_exposition({"loss": float("nan"), "eval_loss": 2.0}, run='a"b').decode()
    assert '# TYPE kiln_loss gauge' in text
    assert 'kiln_loss{run="a\\"b"} NaN' in text
    assert 'kiln_eval_loss{run="a\\"b"} 2.0' in text


def test_port_in_use_is_bad_input():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="metrics.prometheus_port"):
            check_bindable("127.0.0.1", port)
    with pytest.raises(ConfigError, match="metrics.prometheus_host"):
        check_bindable("no-such-host.invalid", 0)


def test_build_sinks_serves_on_loopback_by_default(tmp_path):
    cfg = MetricsConfig(console=False, tensorboard=False, prometheus=True, prometheus_port=0)
    assert cfg.prometheus_host == "127.0.0.1"
    logger = build_sinks(cfg, tmp_path / "run", 10, is_main=True)
    try:
        (sink,) = [s for s in logger.sinks if isinstance(s, PrometheusSink)]
        logger.log({"step": 1, "loss": 3.0})
        assert _values(_scrape(sink.url))['kiln_loss{run="run"}'] == 3.0
    finally:
        logger.close()
    assert build_sinks(cfg, tmp_path / "run", 10, is_main=False).sinks == []
