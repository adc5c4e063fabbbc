"""Bad input at the edges of the machine (issue 33, low items): what the environment, the file
system and a held port show. Each case: one ``error:`` line naming the key or the variable,
exit 2, no traceback, nothing written; or, where nothing is wrong, no line at all.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.helpers import twin_doc
from tests.helpers import write_experiment
from tests.reliability_tests._support import SUBPROCESS_ENV
from tests.test_bad_input_preflight import experiment
from tests.test_bad_input_preflight import port
from tests.test_bad_input_preflight import refused

# Starts the private cluster as the driver does, then stops it.
_CONNECT = """
import sys
from rayspec._config import load_config
from rayspec.tune._cluster import connect, disconnect
disconnect(connect(load_config(sys.argv[1], sys.argv[2:])))
print("connected", flush=True)
"""


def test_a_held_dashboard_port_says_nothing_with_the_dashboard_off(tmp_path) -> None:
    """Ray bound the port it was given even with the dashboard off, and logged "Failed to bind
    to 127.0.0.1:8265 because it's already occupied" for a dashboard nobody asked for."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        path = write_experiment(str(tmp_path), twin_doc(str(tmp_path / "runs")))
        overrides = ["cluster.include_dashboard=false", f"cluster.dashboard_port={port}"]
        done = subprocess.run(
            [sys.executable, "-c", _CONNECT, path, *overrides], cwd=REPO, env=SUBPROCESS_ENV,
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert done.returncode == 0 and "connected" in done.stdout, done.stderr
    assert "Failed to bind" not in done.stderr, done.stderr
    assert str(port) not in done.stderr, done.stderr


# -- prompt files (issue 33, item 8; the 100,000-deep low item) -------------------------------


@pytest.fixture
def no_ray(monkeypatch) -> None:
    import ray

    def refused_here(*_a: object, **_k: object) -> None:
        raise AssertionError("ray.init was called for a refused experiment")

    monkeypatch.setattr(ray, "init", refused_here)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # A lone surrogate: every request of every trial failed as `unknown` ("utf-8").
        ('{"prompt": "ok"}\n{"prompt": "caf\\ud83d"}\n',
         ":2: the prompt holds a lone surrogate (U+D83D at character 3)"),
        ('[\n {"prompt": "ok"},\n {"prompt": "x", "category": "\\udc00"}\n]\n',
         ":3: 'category' holds a lone surrogate (U+DC00"),
        ("[" * 100_000 + "]" * 100_000 + "\n", ":1: nested too deeply for a JSON reader"),
        ('{"prompt": "x", "output_tokens": 1' + "0" * 5000 + "}\n",
         ":1: not a usable JSON value (Exceeds the limit (4300 digits)"),
        ('{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n'.encode("latin-1"),
         ":2: not UTF-8 text (byte 0xe9 at offset 32)"),
    ],
)  # fmt: skip
def test_a_prompt_file_that_cannot_be_sent_is_refused_at_its_line(
    body: str | bytes, expected: str, tmp_path, capsys, no_ray
) -> None:
    data = tmp_path / "prompts.jsonl"
    if isinstance(body, bytes):
        data.write_bytes(body)
    else:
        data.write_text(body, encoding="utf-8")
    line = refused([experiment(tmp_path), f"bench.prompts={data}", port()], capsys, expected)
    assert line.startswith(f"error: bench.prompts: {data}:"), line


@pytest.mark.parametrize(
    "body",
    [
        # JSON strings may hold U+2028, U+2029 and U+0085 as they are: not line breaks.
        '{"prompt": "one\u2028two"}\n{"prompt": "three\x85four"}\n',
        '\ufeff{"prompt": "a file saved with a byte order mark"}\n',
        '{"prompt": "a surrogate pair is a character: \\ud83d\\ude00"}\r\n',
    ],
)
def test_prompt_files_that_are_fine_load(body: str, tmp_path) -> None:
    from rayspec.bench import load_dataset

    data = tmp_path / "prompts.jsonl"
    data.write_text(body, encoding="utf-8")
    texts = [r.text for r in load_dataset(str(data))]
    assert texts and all(t.encode("utf-8") for t in texts)
    assert "one\u2028two" in texts or "😀" in texts[0] or "order mark" in texts[0]
