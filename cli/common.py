"""Shared CLI plumbing: one-line errors with exit code 2, option parsing, the status server, progress display."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tomllib
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from swarm_node.errors import UserError

console = Console(stderr=True, soft_wrap=True)  # one error = one line, never wrapped


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UserError into `error: ...` on stderr and exit code 2; Ctrl-C into exit 130."""
    try:
        yield
    except UserError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print("interrupted")
        raise typer.Exit(130) from None


def configure_logging() -> None:
    """Library warnings (network reachability, bootstrap state) as plain lines on stderr; dependency noise
    (weight-loading progress bars, vLLM's FutureWarnings about torch APIs) off, since it is not actionable."""
    import logging
    import warnings

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\..*)?")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def parse_task_options(items: list[str] | None) -> dict[str, Any] | None:
    """KEY=VALUE pairs; values are read as TOML scalars (1, 2.5, true, "text") or else as plain strings."""
    if not items:
        return None
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--task-option must look like KEY=VALUE, got {item!r}")
        try:
            options[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            options[key] = raw
    return options


def start_status_server(stats: Any, host: str, port: int, token: str) -> Any:
    """Start the read-only status server before anything slow; returns it (or None when port is -1)."""
    if port < 0:
        return None
    from swarm_node.status.server import StatusServer

    server = StatusServer(stats, host=host, port=port, token=token or None)
    url = server.start()
    console.print(f"status: {url}", highlight=False)
    if server.token and not token:
        console.print(f"status token (generated): {server.token}", highlight=False)
    return server


class StepProgress:
    """A live progress line: step, mean reward, accuracy, tokens/s; plus a bar for the model build."""

    def __init__(self, total_steps: int) -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                                 "{task.total}"), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                 console=console, transient=False, disable=not sys.stderr.isatty())
        self.total_steps = total_steps
        self.build_task: Any = None
        self.step_task: Any = None
        self.plain = not sys.stderr.isatty()

    def __enter__(self) -> StepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def build(self, done: int, total: int, info: str) -> None:
        if self.build_task is None:
            self.build_task = self.progress.add_task("building default model", total=total, info="")
            if self.plain:
                console.print("building the default model (once; cached for later runs)...")
        self.progress.update(self.build_task, completed=done, info=info)
        if self.plain and (done % 50 == 0 or done == total):
            console.print(f"  warm-up {done}/{total} {info}", highlight=False)

    def step(self, m: dict[str, Any]) -> None:
        if "reward_mean" in m:
            info = (f"reward {m['reward_mean']:.3f}  acc {m['accuracy']:.3f}  {m['tokens_per_s']:.0f} tok/s  "
                    f"v{m['policy_version']}")
        else:
            info = f"skipped: {m.get('skipped')}"
        if self.step_task is None:
            self.step_task = self.progress.add_task("training", total=self.total_steps, info="")
        self.progress.update(self.step_task, completed=m["step"], info=info)
        if self.plain:
            console.print(f"step {m['step']}/{self.total_steps} {info}", highlight=False)

    def log(self, message: str) -> None:
        self.progress.console.print(message, highlight=False)
