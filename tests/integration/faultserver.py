"""Serve an OpenAI-compatible (vLLM-like) API that can be killed, restarted and held on cue.

Run as its own process, so a test can SIGKILL it and start it again on the same port, which
vLLM itself (two minutes to start on a CPU) cannot do quickly:

    python tests/integration/faultserver.py --port 8123 --log requests.jsonl

Endpoints: ``/health``, ``/v1/models``, ``/metrics`` (vLLM's counter names; the counters
live in memory, so a restart resets them as vLLM's do), ``/tokenize`` and streamed
``/v1/chat/completions``. Every chat request that was answered to the end appends one JSON
line to the log (request id, seed, a hash of what was asked, token counts): the server's own
record of what it finished, which tests hold the client's ``llm_calls`` against.

``POST /_hold`` with ``{"hold": true}`` makes new chat requests wait before their first byte
until ``{"hold": false}``; ``"drop": true`` closes the connections of the requests held now,
unanswered. ``GET /_state`` says how many are held, streaming and finished.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DECISION = {"rating": "Overweight", "score": 0.4, "confidence": 0.6,
            "summary": "Fault-server decision: steady trend outweighs the risks."}


def count_tokens(text: str) -> int:
    """Count 'tokens' as one per 4 bytes (at least 1), like the unit tests' fake server."""
    return max(1, len(text.encode()) // 4)


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(count_tokens(str(m.get("content") or "")) + 4 for m in messages)


def request_key(body: dict[str, Any]) -> str:
    """Identify what was asked (not when): the same request sent twice has the same key."""
    asked = {k: body.get(k) for k in ("model", "messages", "response_format", "max_tokens",
                                      "seed")}
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:24]


class State:
    """What the server counts and holds; shared by the handler threads."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.boot = uuid.uuid4().hex[:8]  # request ids never repeat across restarts
        self.lock = threading.Condition()
        self.hold = False
        self.drops = 0  # bumped to drop the requests held now, unanswered
        self.held = 0
        self.streaming = 0
        self.finished = 0
        self.counter = 0
        self.prompt_total = 0
        self.generation_total = 0

    def next_id(self) -> str:
        with self.lock:
            self.counter += 1
            return f"chatcmpl-{self.boot}-{self.counter}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read the log file
        pass

    # --- plumbing ----------------------------------------------------------------------------

    def _json(self, status: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _body(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        return json.loads(self.rfile.read(length)) if length else {}

    # --- routes ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        s = self.state
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": s.args.model, "object": "model", "max_model_len": s.args.max_model_len}]})
        elif self.path == "/metrics":
            with s.lock:
                text = (
                    f'vllm:num_requests_running{{model_name="{s.args.model}"}} {s.streaming}\n'
                    f'vllm:num_requests_waiting{{model_name="{s.args.model}"}} {s.held}\n'
                    f'vllm:kv_cache_usage_perc{{model_name="{s.args.model}"}} 0.1\n'
                    f'vllm:num_preemptions_total{{model_name="{s.args.model}"}} 0\n'
                    f'vllm:prompt_tokens_total{{model_name="{s.args.model}"}} {s.prompt_total}\n'
                    f'vllm:generation_tokens_total{{model_name="{s.args.model}"}} '
                    f'{s.generation_total}\n')
            raw = text.encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        elif self.path == "/_state":
            with s.lock:
                self._json(200, {"held": s.held, "streaming": s.streaming,
                                 "finished": s.finished, "hold": s.hold, "boot": s.boot})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        s = self.state
        body = self._body()
        if self.path == "/_hold":
            with s.lock:
                s.hold = bool(body.get("hold"))
                if body.get("drop"):
                    s.drops += 1
                s.lock.notify_all()
            self._json(200, {"hold": s.hold})
        elif self.path == "/tokenize":
            self._json(200, {"count": prompt_tokens(body.get("messages", [])),
                             "max_model_len": s.args.max_model_len, "tokens": []})
        elif self.path == "/v1/chat/completions":
            self._chat(body)
        else:
            self._json(404, {"detail": "Not Found"})

    def _chat(self, body: dict[str, Any]) -> None:
        s = self.state
        with s.lock:
            s.held += 1
            drops = s.drops
            while s.hold and s.drops == drops:
                s.lock.wait()
            s.held -= 1
            if s.drops != drops:
                self.close_connection = True  # dropped: the connection closes unanswered
                return
            s.streaming += 1
        try:
            self._stream(body)
        finally:
            with s.lock:
                s.streaming -= 1

    def _stream(self, body: dict[str, Any]) -> None:
        s = self.state
        request_id = s.next_id()
        structured = body.get("response_format") is not None
        text = (json.dumps(DECISION) if structured else
                f"Fault-server analysis {request_id}: the evidence is mixed. " * 3)
        prompt, completion = prompt_tokens(body.get("messages", [])), count_tokens(text)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> None:
            chunk = {"id": request_id, "object": "chat.completion.chunk", "created": 0,
                     "model": s.args.model, "choices": choices, "usage": usage}
            data = f"data: {json.dumps(chunk)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                "finish_reason": None}])
        step = max(1, len(text) // s.args.chunks)
        for i in range(0, len(text), step):
            time.sleep(s.args.chunk_delay)
            event([{"index": 0, "delta": {"content": text[i:i + step]}, "finish_reason": None}])
        event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        event([], {"prompt_tokens": prompt, "completion_tokens": completion,
                   "total_tokens": prompt + completion,
                   "prompt_tokens_details": {"cached_tokens": 0}})
        done = b"data: [DONE]\n\n"
        self.wfile.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
        self.wfile.flush()
        # Answered to the end: count it and log it, as the server's own record.
        with s.lock:
            s.finished += 1
            s.prompt_total += prompt
            s.generation_total += completion
            line = json.dumps({"id": request_id, "boot": s.boot, "seed": body.get("seed"),
                               "key": request_key(body), "structured": structured,
                               "prompt_tokens": prompt, "completion_tokens": completion,
                               "at": time.time()})
            with open(s.args.log, "a") as log:
                log.write(line + "\n")
                log.flush()
                os.fsync(log.fileno())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True, help="JSON lines, one per finished request")
    parser.add_argument("--model", default="fault-model")
    parser.add_argument("--max-model-len", type=int, default=32_768)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--chunk-delay", type=float, default=0.05)
    args = parser.parse_args()
    Handler.state = State(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
