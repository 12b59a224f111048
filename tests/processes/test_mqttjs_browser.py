"""MQTT.js (from npm, tests/browser/package.json) in Debian's headless Chromium, publishing and subscribing
through the WebSockets listener (8083) of a live group: a page loaded from file:// connects with MQTT 5,
subscribes, publishes, and receives both its own message and one a paho client sent over TCP, which in turn
receives the browser's. Chromium is driven over its DevTools pipe (tests/processes/test_status_page_browser.py)."""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from pairmq.appliance.roles import Role
from tests.harness.group import active_group
from tests.processes.test_status_page_browser import DevTools

MQTT_JS = Path(__file__).resolve().parents[1] / "browser" / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"
P = Role.PRIMARY

PAGE = """<!doctype html><html><head><meta charset="utf-8"><script src="{script}"></script></head><body><script>
window.result = {{state: "connecting", got: [], error: null}};
const client = mqtt.connect({url}, {{clientId: "chromium-mqttjs", protocolVersion: 5, reconnectPeriod: 0}});
client.on("connect", () => {{
  client.subscribe("browser/#", {{qos: 1}}, (err) => {{
    if (err) {{ window.result.error = String(err); return; }}
    window.result.state = "subscribed";
    client.publish("browser/from-chromium", "hello from MQTT.js", {{qos: 1}}, (err) => {{
      if (err) window.result.error = String(err); else window.result.published = true;
    }});
  }});
}});
client.on("message", (topic, payload) => window.result.got.push([topic, payload.toString()]));
client.on("error", (err) => {{ window.result.error = String(err); }});
</script></body></html>"""


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_mqttjs_in_chromium_publishes_and_subscribes_over_websockets(tmp_path):
    if not MQTT_JS.exists():
        pytest.fail("MQTT.js is not installed: run .ci/setup (it runs npm ci in tests/browser)")
    with active_group(tmp_path / "group") as group:
        url = f"ws://{group.address(P)}:{group.config.ports.mqtt_ws}/mqtt"
        page = tmp_path / "mqttjs.html"
        page.write_text(PAGE.format(script=MQTT_JS.as_uri(), url=json.dumps(url)))
        from_browser: queue.Queue = queue.Queue()
        subscribed = threading.Event()
        paho = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-beside-chromium")
        paho.on_message = lambda _c, _u, m: from_browser.put((m.topic, m.payload))
        paho.on_subscribe = lambda *a: subscribed.set()
        paho.connect(group.address(P), group.config.ports.mqtt)
        paho.subscribe("browser/from-chromium", 1)
        paho.loop_start()
        browser = DevTools(tmp_path)
        try:
            assert subscribed.wait(10)
            browser.open(page.as_uri(), headers={})
            browser.wait_for("MQTT.js subscribed and published",
                             "window.result && (window.result.error || window.result.published)")
            assert browser.js("window.result.error") is None, browser.js("window.result.error")
            paho.publish("browser/from-paho", b"hello from paho", qos=1).wait_for_publish(10)
            browser.wait_for("both messages in the page", "window.result.got.length >= 2")
            got = browser.js("window.result.got")
            assert sorted(map(tuple, got)) == [("browser/from-chromium", "hello from MQTT.js"),
                                               ("browser/from-paho", "hello from paho")]
            assert from_browser.get(timeout=10) == ("browser/from-chromium", b"hello from MQTT.js")
            clients = group.api(P, "/api/v1/clients")["clients"]
            assert "chromium-mqttjs" in {c["client_id"] for c in clients}
        finally:
            browser.close()
            paho.loop_stop()
            paho.disconnect()
