"""Sample replay (docs/background.md#reading-samples): SDK helper, lookup, rendering, HTTP contract, CLI text."""

from __future__ import annotations

import json
import math
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from grpo_monitor.runtime.replay import (
    available_steps,
    find_samples,
    print_replay,
    render_html,
    render_json,
    replay_http,
)
from grpo_monitor.sdk.samples import (
    TRUNCATION_MARKER,
    replay_samples,
    should_log_samples,
)
from grpo_monitor.contract.snapshot import Sample
from grpo_monitor.sdk.writer import SnapshotWriter

HOSTILE = "<script>alert(1)</script> \"quoted\" 'single' & amp"


def _rollout(step: int, n: int = 3, g: int = 4) -> tuple[list[str], list[str], list[float], list[int]]:
    prompts = [f"prompt {i} of step {step}" for i in range(n)]
    responses = [f"answer {j} to prompt {i} at step {step}" for i in range(n) for j in range(g)]
    rewards = [float(j) / g for i in range(n) for j in range(g)]
    lengths = [10 + j for i in range(n) for j in range(g)]
    return prompts, responses, rewards, lengths


def _write_run(root: Path, run: str = "exp", steps: int = 25, every: int = 10) -> None:
    with SnapshotWriter(root, run, rank=0, world_size=1) as w:
        for step in range(1, steps + 1):
            samples = None
            if should_log_samples(step, every):
                p, r, rew, lens = _rollout(step)
                samples = replay_samples(p, r, rew, lens, prompt_types=["easy", "hard", "easy"])
            assert w.log({"reward/mean": 0.1 * step}, step, samples=samples)


# -- sdk/samples.py ---------------------------------------------------------------------------


def test_should_log_samples() -> None:
    assert should_log_samples(0) and should_log_samples(500) and should_log_samples(1000)
    assert not should_log_samples(499) and not should_log_samples(501)
    assert should_log_samples(30, every=10)
    assert not should_log_samples(30, every=0) and not should_log_samples(-10, every=10)


def test_replay_samples_flat_and_nested_agree_and_sort_best_first() -> None:
    p, r, rew, lens = _rollout(7, n=2, g=4)
    flat = replay_samples(p, r, rew, lens, prompt_types="math")
    nested = replay_samples(p, [r[:4], r[4:]], [rew[:4], rew[4:]], [lens[:4], lens[4:]], prompt_types="math")
    assert flat == nested
    assert len(flat) == 2
    first = flat[0]
    assert first["prompt"] == "prompt 0 of step 7" and first["prompt_type"] == "math"
    assert [x["reward"] for x in first["responses"]] == [0.75, 0.5, 0.25, 0.0]
    assert first["responses"][0] == {"text": "answer 3 to prompt 0 at step 7", "reward": 0.75, "length": 13}
    # The shape the contract validates.
    Sample.model_validate(first)


def test_replay_samples_accepts_tolist_objects() -> None:
    class FakeTensor:
        def __init__(self, data: list) -> None:
            self.data = data

        def tolist(self) -> list:
            return self.data

    out = replay_samples(["q"], [["a", "b"]], FakeTensor([[0.5, 1.0]]), FakeTensor([[3, 4]]))
    assert out == [{"prompt": "q", "responses": [{"text": "b", "reward": 1.0, "length": 4},
                                                  {"text": "a", "reward": 0.5, "length": 3}]}]


def test_replay_samples_caps() -> None:
    prompts = [f"p{i}" for i in range(20)]
    responses = [["x" * 5000] + [f"r{j}" for j in range(1, 16)] for _ in prompts]
    rewards = [[float(j) for j in range(16)] for _ in prompts]
    out = replay_samples(prompts, responses, rewards, max_prompts=5, max_responses=4, max_chars=100)
    assert len(out) == 5
    assert out[0]["prompt"] == "p0" and out[-1]["prompt"] == "p19"  # spread over the batch
    for sample in out:
        rs = sample["responses"]
        assert len(rs) == 4
        # best and worst kept
        assert rs[0]["reward"] == 15.0 and rs[-1]["reward"] == 0.0
        long = rs[-1]["text"]
        assert long == "x" * 100 + TRUNCATION_MARKER.format(n=4900)
        assert "length" not in rs[0]  # no lengths given
    # The line a record with capped samples adds stays small.
    assert len(json.dumps(out)) < 5 * 4 * (100 + 60) + 2000


def test_replay_samples_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError):
        replay_samples(["a", "b"], ["x", "y", "z"], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        replay_samples(["a"], [["x", "y"]], [[1.0]])
    with pytest.raises(ValueError):
        replay_samples(["a", "b"], ["x", "y"], [1.0, 2.0], prompt_types=["t"])


# -- find_samples -----------------------------------------------------------------------------


def test_find_samples_exact_newest_and_nearest_earlier(tmp_path: Path) -> None:
    _write_run(tmp_path, steps=25, every=10)
    assert available_steps(tmp_path, "exp") == [10, 20]

    step, samples = find_samples(tmp_path, "exp", 10)  # type: ignore[misc]
    assert step == 10 and len(samples) == 3
    assert samples[0].prompt == "prompt 0 of step 10" and samples[1].prompt_type == "hard"
    assert [r.reward for r in samples[0].responses] == [0.75, 0.5, 0.25, 0.0]

    assert find_samples(tmp_path, "exp", None)[0] == 20  # type: ignore[index]
    step, samples = find_samples(tmp_path, "exp", 17)  # type: ignore[misc]
    assert step == 10 and samples[0].prompt == "prompt 0 of step 10"
    assert find_samples(tmp_path, "exp", 5) is None  # nothing at or before
    assert find_samples(tmp_path, "missing", None) is None


def test_find_samples_skips_bad_lines_and_reads_json_files(tmp_path: Path) -> None:
    _write_run(tmp_path, steps=10, every=10)
    run_dir = tmp_path / "exp"
    with open(run_dir / "rank-0.jsonl", "ab") as fh:
        fh.write(b'{"samples": oops not json\n')
        fh.write(b'{"step": 30, "metrics": {}, "samples": "not a list"}\n')
        fh.write(b'{"step": 40, "metrics": {}, "samples": [{"prompt": "torn')  # no newline yet
    (run_dir / "rank-1.json").write_text(json.dumps(
        {"step": 10, "rank": 1, "metrics": {}, "samples": [{"prompt": "from rank 1", "responses": []}]}))
    (run_dir / ".scratch.json").write_text(json.dumps(
        {"step": 50, "metrics": {}, "samples": [{"prompt": "hidden"}]}))
    assert available_steps(tmp_path, "exp") == [10]
    step, samples = find_samples(tmp_path, "exp", None)  # type: ignore[misc]
    assert step == 10
    assert [s.prompt for s in samples][-1] == "from rank 1" and len(samples) == 4  # ranks joined


# -- rendering and HTTP -----------------------------------------------------------------------


def _hostile_run(root: Path) -> None:
    with SnapshotWriter(root, "evil", rank=0, world_size=1) as w:
        samples = replay_samples([HOSTILE], [[HOSTILE, "fine </pre><b>x</b>"]], [[1.0, math.nan]], [[5, 6]],
                                 prompt_types=["<i>t</i>"])
        w.log({"reward/mean": 1.0}, 500, samples=samples)


def test_html_escapes_hostile_text_and_json_keeps_it(tmp_path: Path) -> None:
    _hostile_run(tmp_path)
    status, ctype, body = replay_http(tmp_path, parse_qs("run=evil&step=500&format=html"), "")
    assert status == 200 and ctype.startswith("text/html")
    page = body.decode()
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;quoted&quot;" in page and "&#x27;single&#x27;" in page and "&amp; amp" in page
    assert "<b>x</b>" not in page and "<i>t</i>" not in page and "&lt;i&gt;t&lt;/i&gt;" in page
    assert "http://" not in page and "https://" not in page and "src=" not in page  # self-contained

    status, ctype, body = replay_http(tmp_path, parse_qs("run=evil&step=500&format=json"), "")
    assert status == 200 and ctype == "application/json"
    data = json.loads(body)  # strict: NaN reward became null
    assert data["run"] == "evil" and data["step"] == 500
    sample = data["samples"][0]
    assert sample["prompt"] == HOSTILE and sample["prompt_type"] == "<i>t</i>"
    assert sample["responses"][0] == {"text": HOSTILE, "reward": 1.0, "length": 5}
    assert sample["responses"][1]["reward"] is None


def test_http_format_from_accept_and_nearest_step(tmp_path: Path) -> None:
    _write_run(tmp_path, steps=25, every=10)
    status, ctype, body = replay_http(tmp_path, parse_qs("run=exp&step=15"), "text/html,application/xhtml+xml")
    assert status == 200 and ctype.startswith("text/html")
    assert "nearest earlier step with samples, 10" in body.decode()
    status, ctype, body = replay_http(tmp_path, parse_qs("run=exp"), "*/*")
    assert status == 200 and ctype == "application/json"
    data = json.loads(body)
    assert data["step"] == 20 and data["requested_step"] is None


@pytest.mark.parametrize("query", ["", "run=", "run=..", "run=.", "run=a/b", "run=../etc",
                                   "run=..%2F..%2Fetc", "run=%2Fetc", "run=a%5Cb", "run=a%00b",
                                   "run=exp&step=-1", "run=exp&step=abc", "run=exp&format=xml"])
def test_http_rejects_bad_queries(tmp_path: Path, query: str) -> None:
    _write_run(tmp_path)
    status, ctype, _ = replay_http(tmp_path, parse_qs(query, keep_blank_values=True), "*/*")
    assert status == 400 and ctype.startswith("text/plain")


def test_path_traversal_cannot_read_outside(tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    root.mkdir()
    _write_run(tmp_path, run="outside")  # tmp_path/outside, next to the snapshot folder
    assert replay_http(root, {"run": ["../outside"]}, "*/*")[0] == 400
    assert find_samples(root, "../outside", None) is None
    assert available_steps(root, "../outside") == []


def test_http_404_without_samples(tmp_path: Path) -> None:
    with SnapshotWriter(tmp_path, "plain", rank=0, world_size=1) as w:
        for step in range(5):
            w.log({"reward/mean": 0.5}, step)
    assert replay_http(tmp_path, {"run": ["plain"]}, "*/*")[0] == 404
    assert replay_http(tmp_path, {"run": ["nope"]}, "*/*")[0] == 404
    _write_run(tmp_path, steps=25, every=10)
    assert replay_http(tmp_path, {"run": ["exp"], "step": ["9"]}, "*/*")[0] == 404


def test_render_functions_directly() -> None:
    samples = [Sample.model_validate({"prompt": "q", "responses": [
        {"text": "low", "reward": -1.0}, {"text": "high", "reward": 2.0, "length": 3}]})]
    data = json.loads(render_json("r", 3, samples))
    assert [x["text"] for x in data["samples"][0]["responses"]] == ["high", "low"]
    page = render_html("r", 3, samples).decode()
    assert page.index("high") < page.index("low") and "reward gap 3" in page


# -- CLI text ---------------------------------------------------------------------------------


def test_print_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_run(tmp_path, steps=25, every=10)
    assert print_replay(tmp_path, "exp", 20) == 0
    out = capsys.readouterr().out
    assert out.startswith("run exp, step 20: 3 prompt(s)")
    assert "=== prompt 2 [hard] ===" in out and "  prompt 1 of step 20" in out
    assert "--- response 1: reward 0.75, length 13" in out
    assert out.index("answer 3 to prompt 0") < out.index("answer 0 to prompt 0")

    assert print_replay(tmp_path, "exp", 15) == 0
    assert "step 15 has no samples; nearest earlier step shown" in capsys.readouterr().out

    assert print_replay(tmp_path, "exp", 5) == 1
    err = capsys.readouterr().err
    assert "no samples" in err and "steps with samples: 10, 20" in err
    assert print_replay(tmp_path, "../x", None) == 2


def test_print_replay_neutralises_terminal_escapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SnapshotWriter(tmp_path, "ansi", rank=0, world_size=1) as w:
        w.log({}, 1, samples=replay_samples(["\x1b[2Jclear"], [["ok\x07\nline2"]], [[1.0]]))
    assert print_replay(tmp_path, "ansi", None) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2Jclear" in out and "    line2" in out


def test_replay_is_served_by_the_exporter_and_the_cli(tmp_path: Path) -> None:
    """The exporter's /replay route (with --web.enable-replay; off by default, since samples can
    be proprietary training data) and `grpo-monitor replay` call the same replay module."""
    import subprocess
    import sys

    import requests

    from grpo_monitor.runtime.app import Exporter
    from grpo_monitor.runtime.config import ExporterConfig
    from grpo_monitor.sdk.samples import replay_samples
    from grpo_monitor.sdk.writer import SnapshotWriter

    with SnapshotWriter(tmp_path, "r1", rank=0, world_size=1) as w:
        w.log({"loss": 0.1}, 500, samples=replay_samples(
            ["<b>2+2</b>"], [["4", "<script>alert(1)</script>"]], [[1.0, 0.0]]))
    exporter = Exporter(ExporterConfig(snapshot_dir=tmp_path, listen_address="127.0.0.1:0",
                                       gpu_collector=False)).start()
    try:
        off = requests.get(f"{exporter.url}/replay?run=r1&step=500", timeout=5)
        assert off.status_code == 404 and "--web.enable-replay" in off.text
        assert "2+2" not in off.text
        assert "--web.enable-replay" in requests.get(f"{exporter.url}/", timeout=5).text
    finally:
        exporter.stop()
    exporter = Exporter(ExporterConfig(snapshot_dir=tmp_path, listen_address="127.0.0.1:0",
                                       gpu_collector=False, enable_replay=True)).start()
    try:
        page = requests.get(f"{exporter.url}/replay?run=r1&step=500", timeout=5,
                            headers={"Accept": "text/html"})
        assert page.status_code == 200 and "<script>alert" not in page.text
        assert "&lt;script&gt;" in page.text
        assert "default-src 'none'" in page.headers["Content-Security-Policy"]
        data = requests.get(f"{exporter.url}/replay?run=r1&format=json", timeout=5).json()
        assert "<script>alert(1)</script>" in json.dumps(data)
        assert requests.get(f"{exporter.url}/replay?run=../etc", timeout=5).status_code == 400
    finally:
        exporter.stop()
    out = subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "replay", "--snapshot.dir",
                          str(tmp_path), "r1", "--step", "500"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "2+2" in out.stdout


@pytest.mark.parametrize("fmt", ["html", "json"])
def test_a_lone_surrogate_in_a_sample_is_answered(tmp_path: Path, fmt: str) -> None:
    # A trainer's decoded text may hold a lone surrogate; json.dumps writes it as "\ud800",
    # valid JSON, which UTF-8 cannot carry back out.
    record = {"run": "odd", "rank": 0, "step": 1, "metrics": {"reward/mean": 1.0},
              "samples": replay_samples(["p\ud800"], [["r\udfff"]], [[1.0]], [[1]])}
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "rank-0.jsonl").write_text(json.dumps(record) + "\n")
    status, _, body = replay_http(tmp_path, parse_qs(f"run=odd&step=1&format={fmt}"), "")
    assert status == 200 and "p?" in body.decode("utf-8") and "r?" in body.decode("utf-8")


def test_replay_shows_the_samples_of_the_pass_that_stands(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Samples at 10, 20, 30, then a rollback to step 15 and steps 16..30 again with other
    samples: step 20 and 30 show the second pass's, and say so; step 10 stands as it was."""
    with SnapshotWriter(tmp_path, "exp", rank=0, world_size=1) as w:
        for step in range(1, 31):
            p, r, rew, lens = _rollout(step)
            w.log({"reward/mean": 0.1}, step,
                  samples=replay_samples([f"first {x}" for x in p], r, rew, lens)
                  if step % 10 == 0 else None)
        w.log({}, 15, events=[{"type": "rollback", "from_step": 31, "to_step": 15}])
        for step in range(16, 26):
            p, r, rew, lens = _rollout(step)
            w.log({"reward/mean": 0.1}, step,
                  samples=replay_samples([f"second {x}" for x in p], r, rew, lens)
                  if step % 10 == 0 else None)
    assert available_steps(tmp_path, "exp") == [10, 20]  # 30 was undone and not logged again
    assert find_samples(tmp_path, "exp", 30)[1][0].prompt.startswith("second")  # type: ignore[index]
    assert find_samples(tmp_path, "exp", 10)[1][0].prompt.startswith("first")  # type: ignore[index]
    status, _, body = replay_http(tmp_path, parse_qs("run=exp&step=20"), "text/html")
    assert status == 200 and "Step 20 was logged again after the run went back to step 15" in body.decode()
    data = json.loads(replay_http(tmp_path, parse_qs("run=exp&step=20&format=json"), "")[2])
    assert data["undone"] == [{"steps": [20, 30], "back_to": 15}]
    assert json.loads(replay_http(tmp_path, parse_qs("run=exp&step=10&format=json"), "")[2])["undone"] == []
    assert print_replay(tmp_path, "exp", 20) == 0
    assert "Step 20 was logged again after the run went back to step 15" in capsys.readouterr().out
