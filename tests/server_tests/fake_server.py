"""A tiny stand-in for ``sglang.launch_server`` used by the server tests (stdlib only).

It answers ``/health_generate`` with 503 until ``--ready-after-s`` has passed and 200 after,
serves ``/get_server_info`` and ``/flush_cache``, and can spawn a process tree (a child, a
grandchild, a grandchild that called setsid, and an orphan in its own session) whose pids it
prints as ``FAKE_PID role=pid`` lines before it becomes ready. ``--fail NAME`` prints one of
SGLang's real failure texts (failure_lines.py) and exits with its status.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from failure_lines import LINES  # noqa: E402

READY_LINE = "The server is fired up and ready to roll!"


def spawn_tree() -> dict[str, int]:
    pids = {}
    child = subprocess.Popen(["sleep", "600"])
    pids["child"] = child.pid
    group = subprocess.Popen(
        ["sh", "-c", "sleep 600 & echo $!; setsid sleep 601 & echo $!; wait"],
        stdout=subprocess.PIPE,
        text=True,
    )
    pids["sh"] = group.pid
    assert group.stdout is not None
    pids["grandchild"] = int(group.stdout.readline())
    pids["setsid_grandchild"] = int(group.stdout.readline())
    orphan = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess; p = subprocess.Popen(['sleep', '602'], start_new_session=True, "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    pids["setsid_orphan"] = int(orphan.stdout)
    return pids


def die(args: argparse.Namespace) -> None:
    if args.fail:
        text, code, _ = LINES[args.fail]
        sys.stdout.write(text)
    else:
        print("[2026-11-29 12:00:09 TP0] Scheduler hit an exception: Segmentation fault")
        code = 1
    sys.stdout.flush()
    os._exit(code)


def die_on_file(args: argparse.Namespace) -> None:
    """A failure at a moment the test chooses (a delay after ready races the ready wait on a
    loaded machine)."""
    while not os.path.exists(args.fail_on_file):
        time.sleep(0.02)
    die(args)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ready-after-s", type=float, default=0.3)
    ap.add_argument("--never-ready", action="store_true")
    ap.add_argument("--spawn-tree", action="store_true")
    ap.add_argument("--fail", choices=sorted(LINES))
    ap.add_argument("--fail-after-ready-s", type=float, default=None)
    ap.add_argument(
        "--fail-on-file", default="", help="fail (as --fail says) once this file exists"
    )
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--flush-busy", type=int, default=0, help="answer 400 to this many flushes")
    ap.add_argument("--print-env", default="", help="comma-separated names to report")
    ap.add_argument("--say", default="", help="a log line to print at startup")
    ap.add_argument("--note", default="", help="ignored: text only the launch line carries")
    args = ap.parse_args()

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"FAKE_PID server={os.getpid()}", flush=True)
    if args.spawn_tree:
        for role, pid in spawn_tree().items():
            print(f"FAKE_PID {role}={pid}", flush=True)
    if args.say:
        print(args.say, flush=True)
    env = {k: os.environ.get(k) for k in args.print_env.split(",") if k}
    print("FAKE_ENV " + json.dumps(env, sort_keys=True), flush=True)
    if args.fail_on_file:
        threading.Thread(target=die_on_file, args=(args,), daemon=True).start()
    elif args.fail and args.fail_after_ready_s is None:
        text, code, _ = LINES[args.fail]
        time.sleep(0.1)
        sys.stdout.write(text)
        sys.stdout.flush()
        os._exit(code)

    t0 = time.monotonic()
    state = {"flush_busy": args.flush_busy, "ready_logged": False}

    def ready() -> bool:
        ok = not args.never_ready and time.monotonic() - t0 >= args.ready_after_s
        if ok and not state["ready_logged"]:
            state["ready_logged"] = True
            print(f"[2026-11-29 12:00:05] {READY_LINE}", flush=True)
            if args.fail_after_ready_s is not None:
                threading.Thread(target=die_later, daemon=True).start()
        return ok

    def die_later() -> None:
        time.sleep(args.fail_after_ready_s)
        die(args)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            pass

        def reply(self, code: int, body: str, ctype: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                self.reply(200, "") if ready() else self.reply(503, "starting")
            elif self.path in ("/get_server_info", "/server_info"):
                info = {
                    "fake": True,
                    "pid": os.getpid(),
                    "port": args.port,
                    "env": env,
                    "internal_states": [{"last_gen_throughput": 0.0}],
                }
                self.reply(200, json.dumps(info), "application/json")
            elif self.path == "/flush_cache":
                self.flush()
            else:
                self.reply(404, "not found")

        def do_POST(self) -> None:
            if self.path == "/flush_cache":
                self.flush()
            else:
                self.reply(404, "not found")

        def flush(self) -> None:
            if state["flush_busy"] > 0:
                state["flush_busy"] -= 1
                self.reply(400, "busy")
            else:
                print("FAKE_FLUSH", flush=True)
                self.reply(200, "Cache flushed.\nPlease check backend logs for more details.")

    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
