"""A stand-in for vLLM, for tests about the pipeline's orchestration only.

It is a stand-in, not the engine: an HTTP server in this process that answers the OpenAI
completions requests of the real GSM8k suite (lm-eval's stock task on the committed fixture
data) with each question's stored answer, a wrong one, or nothing, and that can fail to start
or die after a number of answers. Started `switchable`, it serves the arms after its first in
turn (`switch` takes on the next arm's behaviour), as a shared vLLM engine does. The tests that
use it are about what the pipeline does around an engine (which arm runs when, what is stored,
how a death, a cancel or a lost claim ends the run); what vLLM itself does is the engine
tier's business (test_gate_e2e.py and the other `@pytest.mark.engine` tests start real engines).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from evals.fixtures.gsm8k_data import TEST_FILE, read_jsonl
from service.engine.launcher import EngineStartError
from service.profiles import Profile

Answers = Literal["right", "wrong", "empty"]


@dataclass
class Behaviour:
    """How one arm's stand-in answers: `answers` to every question, after `delay_s` each; it
    stops answering after `die_after` answers, `exit_at_start` makes its start fail as a
    process exit does, and `switch_fails` makes a shared stand-in's switch to this arm fail."""

    answers: Answers = "right"
    delay_s: float = 0.0
    die_after: int | None = None
    exit_at_start: int | None = None
    switch_fails: bool = False


def _answer_of(prompt: str, answers: Answers) -> str:
    question = prompt.rsplit("Question: ", 1)[-1].rsplit("\nAnswer:", 1)[0]
    stored = next((row["answer"] for row in read_jsonl(TEST_FILE) if row["question"] == question), "#### 0")
    return {"right": f" {stored}\n\n", "wrong": " It is 999.\n#### 999\n\n", "empty": ""}[answers]


class StandInEngine:
    """What the pipeline uses of `service.engine.Engine`, served by a thread of this process."""

    def __init__(
        self,
        profile: Profile,
        run_dir: Path,
        stop_event: threading.Event,
        behaviours: dict[str, Behaviour],
        switchable: bool,
    ) -> None:
        self.profile, self.run_dir, self.stop_event = profile, run_dir, stop_event
        self.behaviours, self.switchable = behaviours, switchable
        self.behaviour = behaviours.get(run_dir.name, Behaviour())
        self.arms = [run_dir.name]
        self.log_path = run_dir / "engine.log"
        self.version: str | None = "stand-in"
        self.models: list[dict[str, Any]] = [{"id": profile.served_model_name}]
        self.startup_s: float | None = 0.0
        self.answered = 0
        self.dead: str | None = None
        self._server: http.server.ThreadingHTTPServer | None = None
        self.url = ""

    @property
    def pid(self) -> int:
        return 0

    def start(self) -> StandInEngine:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("stand-in engine started\n")
        if self.behaviour.exit_at_start is not None:
            raise EngineStartError(
                f"stand-in engine exited with code {self.behaviour.exit_at_start} before /health answered",
                exit_code=self.behaviour.exit_at_start,
                log_tail="stand-in engine: exit at start",
            )
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
                texts = [engine._answer(prompt) for prompt in prompts]
                if any(text is None for text in texts):
                    self.send_error(500, "stand-in engine is dead")
                    return
                choices = [{"index": i, "text": text, "finish_reason": "stop"} for i, text in enumerate(texts)]
                data = json.dumps({"choices": choices, "model": body.get("model")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def _answer(self, prompt: str) -> str | None:
        time.sleep(self.behaviour.delay_s)
        if self.dead is None and self.behaviour.die_after is not None and self.answered >= self.behaviour.die_after:
            self.dead = f"stand-in engine stopped answering after {self.answered} answers"
            with self.log_path.open("a") as log:
                log.write(self.dead + "\n")
            self.stop_event.set()
        if self.dead is not None:
            return None
        self.answered += 1
        return _answer_of(prompt, self.behaviour.answers)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def death_symptom(self) -> str | None:
        return self.dead

    def switch(self, profile: Profile, run_dir: Path) -> dict[str, Any]:
        if not self.switchable or self.dead is not None:
            raise RuntimeError(f"stand-in engine of arm {self.arms[0]} cannot switch (dead: {self.dead})")
        behaviour = self.behaviours.get(run_dir.name, Behaviour())
        if behaviour.switch_fails:
            raise RuntimeError(f"stand-in engine: the switch to arm {run_dir.name} failed")
        self.profile, self.behaviour = profile, behaviour
        self.answered = 0
        self.arms.append(run_dir.name)
        return {"generation": len(self.arms) - 1, "workers": [], "prefix_cache": {"caching": False}}

    def log_tail(self, lines: int = 200) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-lines:]) if self.log_path.exists() else ""

    def receipts(self) -> list[dict[str, Any]]:
        return []


@dataclass
class StandInEngines:
    """An engine factory for `RunContext.open(..., engines=...)`: each arm (its folder's name)
    is served as `behaviours` says (default: every answer right), on its own stand-in or on the
    one it shares."""

    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    started: list[StandInEngine] = field(default_factory=list)

    def __call__(
        self, profile: Profile, run_dir: Path, stop_event: threading.Event, *, switchable: bool
    ) -> StandInEngine:
        engine = StandInEngine(profile, run_dir, stop_event, self.behaviours, switchable)
        self.started.append(engine)
        return engine
