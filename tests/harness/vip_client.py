"""A client without a host list, for the virtual IP tests: it only knows the VIP.

Run inside the client host's namespace: `python -m tests.harness.vip_client --host 10.77.0.100`.
It connects (paho-mqtt, MQTT 5, clean start), subscribes to its own topic, publishes a QoS 1
message every --every-ms and prints one JSON line per event on stdout: "connected" (with the
CONNACK code), "disconnected", and "echo" for each of its messages that came back. After a
disconnect paho reconnects to the same address; whoever holds the VIP then answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import paho.mqtt.client as mqtt

TOPIC = "vip/echo"


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"ms": now_ms(), "ev": event, **fields}) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--client-id", default="vip-client")
    parser.add_argument("--every-ms", type=int, default=50)
    args = parser.parse_args()

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=args.client_id, protocol=mqtt.MQTTv5)
    c.reconnect_delay_set(min_delay=0.1, max_delay=0.5)  # a failover takes ~0.6 s; retry often

    def on_connect(client, userdata, flags, rc, props):
        emit("connected", rc=rc.value)
        if rc == 0:
            client.subscribe(TOPIC + "/" + args.client_id, qos=1)

    def on_disconnect(client, userdata, flags, rc, props):
        emit("disconnected", rc=rc.value if hasattr(rc, "value") else rc)

    c.on_connect = on_connect
    c.on_disconnect = on_disconnect
    c.on_message = lambda client, userdata, msg: emit("echo", seq=int(msg.payload))
    c.connect_async(args.host, 1883, keepalive=5, clean_start=True)
    c.loop_start()
    stop = threading.Event()
    seq = 0
    try:
        while not stop.wait(args.every_ms / 1000):
            if c.is_connected():
                c.publish(TOPIC + "/" + args.client_id, str(seq), qos=1)
                seq += 1
    except KeyboardInterrupt:
        pass
    finally:
        c.loop_stop()


if __name__ == "__main__":
    main()
