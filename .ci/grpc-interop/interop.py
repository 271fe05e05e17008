"""The gRPC interop suite's Python half: one scripted server, and gRPC's own
retrying client (grpcio, the C core) making every scenario's calls.

Run by tests/grpc_interop.rs, which makes the same calls through
`GrpcRetryLayer` while this runs and compares the two:

    python3 interop.py scenarios.json

1. Serves `/interop.Test/<scenario>` on 127.0.0.1, one port per scenario (a
   port is a server name, and grpcio keeps one retry throttle per server name
   in the whole process), and prints {"ports": {scenario: port}} as one line.
2. Makes each scenario's calls with grpcio, a scenario starting every 25 ms
   (all at once, the server's first answers queue behind each other and
   the spacing measured is the server's queue), then prints {"grpcio": {call:
   outcome}} as one line: the Rust side makes its calls then.
3. Once stdin is closed (the Rust side's calls are done), prints {"server":
   {call: [attempt]}} as one line.

A call is named by its `x-call` metadata, `<client>/<scenario>/<index>`; the
server answers its n-th attempt (in order of arrival) as the scenario's
script says and records when it arrived, its `grpc-previous-rpc-attempts`
and the time its `grpc-timeout` left.
"""

import json
import sys
import threading
import time
from concurrent import futures

import grpc

SERVICE = "interop.Test"
# Seconds between one scenario's start and the next's.
STAGGER = 0.025


def code_named(name):
    return grpc.StatusCode[name]


class Script:
    """What the server answers, and what it saw."""

    def __init__(self, scenarios):
        self.scenarios = {s["name"]: s for s in scenarios}
        self.lock = threading.Lock()
        self.seen = {}

    def answer(self, call, attempt):
        """The answer to attempt `attempt` (from 0) of `call`: the script of
        the call's index (the last script repeats), its attempt-th answer
        (the last answer repeats)."""
        _, scenario, index = call.split("/")
        answers = self.scenarios[scenario]["answers"]
        script = answers[min(int(index), len(answers) - 1)]
        return script[min(attempt, len(script) - 1)]

    def handle(self, request, context):
        arrived = time.monotonic()
        metadata = dict(context.invocation_metadata())
        call = metadata.get("x-call", "?/?/0")
        with self.lock:
            attempts = self.seen.setdefault(call, [])
            attempt = len(attempts)
            attempts.append(
                {
                    "at": arrived,
                    "previous": metadata.get("grpc-previous-rpc-attempts"),
                    "left": context.time_remaining(),
                }
            )
        answer = self.answer(call, attempt)
        if answer.get("headers_first"):
            # Committed: the client has the response headers.
            context.send_initial_metadata(())
        delay = answer.get("delay_ms", 0) / 1000
        if delay > 0:
            gone = threading.Event()
            context.add_callback(gone.set)
            gone.wait(delay)
        if "pushback" in answer:
            context.set_trailing_metadata((("grpc-retry-pushback-ms", answer["pushback"]),))
        code = answer.get("code", "OK")
        if code == "OK":
            return b""
        context.abort(code_named(code), "scripted")


class Handler(grpc.GenericRpcHandler):
    def __init__(self, script):
        self.script = script

    def service(self, details):
        if not details.method.startswith("/" + SERVICE + "/"):
            return None
        return grpc.unary_unary_rpc_method_handler(self.script.handle)


def service_config(scenario):
    method = {"name": [{"service": SERVICE}]}
    method.update(scenario["policy"])
    config = {"methodConfig": [method]}
    if "throttling" in scenario:
        config["retryThrottling"] = scenario["throttling"]
    return json.dumps(config)


def run_grpcio(scenario, port, outcomes, lock):
    """The scenario's calls through grpcio's retrying channel, one after
    another (or all at once when the scenario says so)."""
    options = [
        ("grpc.service_config", service_config(scenario)),
        ("grpc.enable_retries", 1),
    ]
    with grpc.insecure_channel("127.0.0.1:%d" % port, options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        method = channel.unary_unary("/%s/%s" % (SERVICE, scenario["name"]))
        timeout = scenario.get("timeout_ms")

        def one(index):
            call = "grpcio/%s/%d" % (scenario["name"], index)
            started = time.monotonic()
            try:
                method(
                    b"",
                    timeout=None if timeout is None else timeout / 1000,
                    metadata=(("x-call", call),),
                )
                code = "OK"
            except grpc.RpcError as error:
                code = error.code().name
            elapsed = (time.monotonic() - started) * 1000
            with lock:
                outcomes[call] = {"code": code, "elapsed_ms": elapsed}

        calls = range(scenario.get("calls", 1))
        if scenario.get("concurrent"):
            threads = [threading.Thread(target=one, args=(i,)) for i in calls]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            for index in calls:
                one(index)


def main():
    with open(sys.argv[1]) as file:
        scenarios = json.load(file)["scenarios"]
    script = Script(scenarios)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=256),
        handlers=(Handler(script),),
        maximum_concurrent_rpcs=None,
    )
    ports = {s["name"]: server.add_insecure_port("127.0.0.1:0") for s in scenarios}
    server.start()
    print(json.dumps({"ports": ports}), flush=True)

    outcomes, lock = {}, threading.Lock()
    threads = [
        threading.Thread(target=run_grpcio, args=(s, ports[s["name"]], outcomes, lock))
        for s in scenarios
    ]
    for thread in threads:
        thread.start()
        time.sleep(STAGGER)
    for thread in threads:
        thread.join()
    with lock:
        print(json.dumps({"grpcio": outcomes}), flush=True)
    # The Rust side's calls are done when it closes stdin.
    sys.stdin.read()
    server.stop(grace=None)
    with script.lock:
        seen = dict(script.seen)
    print(json.dumps({"server": seen}), flush=True)


if __name__ == "__main__":
    main()
