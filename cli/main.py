"""`swarm-node`: the command-line entry point. Thin: parse flags, build the config, call swarm_node."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

# OpenMP's default busy-waiting makes 2 threads on 2 shared cores 3-5x slower than 1 (measured with vLLM on CPU);
# it is read once, when torch loads, so it must be set before anything imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# vLLM's CPU GEMMs (oneDNN) add a primitive to oneDNN's global cache (default 1024 entries) for each new row count,
# and a run meets hundreds of them: RSS grew for ~1000 steps (+18% over a soak). With the global cache off, vLLM's
# per-layer caches still reuse primitives: on 350 varied generate calls, RSS 600 -> 1130 MiB and still rising with
# the default, 600 -> ~730 MiB and flat from call 100 with 0, at about the same speed (bench/memory.py's soak).
# Read once, when oneDNN starts.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.common import (
    StepProgress,
    configure_logging,
    console,
    start_status_server,
    user_errors,
)
from cli.options import config_help, node_overrides
from cli.peers_cmd import peers_app
from swarm_node import variants

if TYPE_CHECKING:
    from swarm_node.config import NodeConfig
    from swarm_node.node.run_files import NodeEvents, RunSummary
    from swarm_node.status.stats import NodeStats
    from swarm_node.train.evaluate import EvalResult

# rich_markup_mode=None: help texts show defaults like [/ip4/0.0.0.0/tcp/0], which rich would parse as a tag.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Decentralized swarm RL for language models: solo, join, simulate.")
app.add_typer(peers_app, name="peers")  # swarm-node peers list | unban (cli/peers_cmd.py)



def _stop_like_ctrl_c(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


@app.callback()
def main() -> None:
    """Decentralized swarm RL for language models."""
    # Ctrl-C and `kill PID` both stop a node cleanly (checkpoint, then exit 130), also when it was started in the
    # background, where the shell hands it SIGINT already ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop_like_ctrl_c)
    # `kill -USR1 PID` writes every thread's Python stack to the log and goes on: how to report a node that hangs
    # (faulthandler writes from the signal itself, so it works while the main thread is stuck in native code).
    # The process's own stderr: sys.stderr may be a capture without a file descriptor (typer's test runner).
    if sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML config file (flags override it)")]
StepsOpt = Annotated[int | None, typer.Option("--steps", help=config_help("run.steps", "training steps"))]
TaskOpt = Annotated[str | None, typer.Option(
    "--task", help="one reasoning-gym dataset instead of the default mix (chain_sum, basic_arithmetic, gcd, "
                   "count_bits)")]
TaskOptionOpt = Annotated[list[str] | None, typer.Option("--task-option", help="dataset option KEY=VALUE")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="local HF causal-LM dir [embedded default]")]
GroupOpt = Annotated[int | None, typer.Option("--group-size", help=config_help("run.group_size",
                                                                                "completions per prompt G"))]
PromptsOpt = Annotated[int | None, typer.Option("--prompts-per-step", help=config_help("run.prompts_per_step",
                                                                                       "prompts per step B"))]
SeedOpt = Annotated[int | None, typer.Option(
    "--seed", help="run seed: task draws, samples, minibatch order; reproduces a run exactly [solo: 0; join: derived "
                   "from the node's identity, so that two peers left at the defaults draw different tasks]")]
RunDirOpt = Annotated[str | None, typer.Option("--run-dir", help="where metrics and checkpoints go")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue from the newest complete checkpoint")]
SamplerOpt = Annotated[str | None, typer.Option("--sampler", help=config_help(
    "sampler.kind", " | ".join(variants.SAMPLER_KINDS)))]
LrOpt = Annotated[float | None, typer.Option("--lr", help=config_help("train.lr", "learning rate"))]
MinibatchOpt = Annotated[int | None, typer.Option("--minibatches", help=config_help("train.minibatches",
                                                                                    "optimizer steps per batch"))]
CkptOpt = Annotated[int | None, typer.Option("--checkpoint-every", help=config_help("run.checkpoint_every",
                                                                                    "checkpoint every K steps"))]
CkptSecondsOpt = Annotated[float | None, typer.Option("--checkpoint-every-s", help=config_help(
    "run.checkpoint_every_s", "also checkpoint once this many seconds passed since the last one; 0: by steps only"))]
EvalOpt = Annotated[int | None, typer.Option("--eval-problems", help=config_help(
    "run.eval_problems", "held-out problems for the final eval"))]
StatusPortOpt = Annotated[int | None, typer.Option("--status-port", help=config_help(
    "status.port", "status API port; 0 ephemeral, -1 off"))]
StatusHostOpt = Annotated[str | None, typer.Option("--status-host", help=config_help("status.host",
                                                                                     "status bind address"))]
StatusTokenOpt = Annotated[str | None, typer.Option("--status-token", help="bearer token for the status API")]
StalenessOpt = Annotated[int | None, typer.Option("--max-staleness", help=config_help(
    "train.max_staleness", "S: version lag allowed between generation and training; >= 1 overlaps them"))]
MaxNewTokensOpt = Annotated[int | None, typer.Option("--max-new-tokens", help=config_help(
    "sampler.max_new_tokens", "generation budget per completion, EOS included; 0: the model's own"))]
PromptFormatOpt = Annotated[str | None, typer.Option("--prompt-format", help=(
    f"how prompts ask and answers are read, the same on every peer: {' | '.join(variants.PROMPT_FORMATS)} [the "
    "model's own: answer-line for the embedded model, think-answer with a chat template]"))]
MaxModelLenOpt = Annotated[int | None, typer.Option("--max-model-len", help=config_help(
    "sampler.max_model_len", "vLLM's context (prompt + completion); 0: the prompt budget + max_new_tokens"))]
TemperatureOpt = Annotated[float | None, typer.Option("--temperature", help=(
    "sampling temperature [the model's own: its generation_config.json's, else 1.0]"))]
LoraRankOpt = Annotated[int | None, typer.Option("--lora-rank", help=config_help(
    "train.lora_rank", "train rank-r LoRA adapters on a frozen base; 0: every weight"))]
DeviceOpt = Annotated[str | None, typer.Option("--device", help=config_help(
    "run.device", f"{' | '.join(variants.DEVICES)} | cuda:N"))]
# The config's default is 0, "derived from the device": the help says what it derives.
BudgetOpt = Annotated[str | None, typer.Option("--memory-budget", help="memory one step may take, e.g. 6GiB, "
                                               "800MiB (a number: MiB) [75% of RAM / 90% of VRAM]")]


@app.command()
def solo(config: ConfigOpt = None, steps: StepsOpt = None, task: TaskOpt = None,
         task_option: TaskOptionOpt = None, model: ModelOpt = None, group_size: GroupOpt = None,
         prompts_per_step: PromptsOpt = None, seed: SeedOpt = None, run_dir: RunDirOpt = None,
         resume: ResumeOpt = False, sampler: SamplerOpt = None, lr: LrOpt = None,
         minibatches: MinibatchOpt = None, checkpoint_every: CkptOpt = None,
         checkpoint_every_s: CkptSecondsOpt = None, eval_problems: EvalOpt = None,
         status_port: StatusPortOpt = None, status_host: StatusHostOpt = None,
         status_token: StatusTokenOpt = None, max_staleness: StalenessOpt = None, device: DeviceOpt = None,
         memory_budget: BudgetOpt = None, max_new_tokens: MaxNewTokensOpt = None,
         max_model_len: MaxModelLenOpt = None, temperature: TemperatureOpt = None,
         lora_rank: LoraRankOpt = None, prompt_format: PromptFormatOpt = None) -> None:
    """Train one node alone, offline, on the embedded default model and task."""
    params = dict(locals())  # the flags, by parameter name: cli/options.NODE_KEYS maps them to config keys
    with user_errors():
        from swarm_node.config import load_config
        from swarm_node.status.stats import NodeStats

        cfg = load_config(config, node_overrides(params))
        configure_logging()
        stats = NodeStats(role="solo")
        server = start_status_server(stats, cfg.status.host, cfg.status.port, cfg.status.token)
        try:
            run_with_progress(cfg, stats, run_solo_node)
        finally:
            if server is not None:
                server.stop()


def run_solo_node(cfg: NodeConfig, stats: NodeStats, events: NodeEvents) -> RunSummary:
    from swarm_node.node.assembly import assemble

    assembly = assemble(cfg, stats=stats, events=events)
    try:
        return assembly.run()
    finally:
        assembly.close()


def run_with_progress(cfg: NodeConfig, stats: NodeStats,
                      runner: Callable[[NodeConfig, NodeStats, NodeEvents], RunSummary]) -> None:
    from swarm_node.node.run_files import NodeEvents

    with StepProgress(cfg.run.steps) as progress:
        summary = runner(cfg, stats, NodeEvents(log=progress.log, build_progress=progress.build,
                                                on_step=progress.step))
    parts = [f"done: {summary.steps} steps in {summary.run_dir}"]
    if summary.first_reward is not None:
        parts.append(f"mean reward {summary.first_reward:.3f} (first steps) -> {summary.last_reward:.3f} "
                     "(last steps)")
    if summary.eval is not None:
        parts.append(heldout_line(summary.eval_before, summary.eval))
    if summary.skipped_steps:
        parts.append(f"{summary.skipped_steps} steps skipped (non-finite values)")
    console.print("; ".join(parts), highlight=False)


def heldout_line(before: EvalResult | None, after: EvalResult) -> str:
    """Held-out greedy accuracy before -> after training, overall and per specialty of the task mix; with per-question
    outcomes, the change with its paired 95% interval over the questions both evals asked."""
    from swarm_node.train import eval_stats

    def change(name: str | None, b: float | None, a: float) -> str:
        if before is None or b is None:
            return f"{a:.3f}"
        text = f"{b:.3f} -> {a:.3f}"
        then, now = before.by_question(name), after.by_question(name)
        if then.keys() & now.keys():
            diff = eval_stats.paired_diff(now, then)
            text += f" ({diff.mean:+.3f} [{diff.ci95[0]:+.3f}, {diff.ci95[1]:+.3f}])"
        return text

    overall = change(None, before.greedy_acc if before else None, after.greedy_acc)
    when = " (before -> after training; change [95% interval])" if before is not None else ""
    per_task = ", ".join(f"{name} {change(name, before.per_task.get(name) if before else None, acc)}"
                         for name, acc in after.per_task.items())
    return (f"held-out greedy accuracy {overall}{when} on {after.size()}"
            + (f" ({per_task})" if per_task else ""))


BootstrapOpt = Annotated[list[str] | None, typer.Option("--bootstrap", help="multiaddr of a peer to join through")]
ListenOpt = Annotated[str | None, typer.Option("--listen", help=config_help("network.listen", "listen multiaddr"))]
AnnounceOpt = Annotated[list[str] | None, typer.Option("--announce-addr", help="address others should dial")]
IdentityOpt = Annotated[str | None, typer.Option("--identity", help="key file [RUN_DIR/identity.key]")]
RelayOpt = Annotated[str | None, typer.Option("--relay", help=config_help(
    "network.relay", "serve as a circuit relay for peers behind NAT: auto (once we are public) | on | off"))]
UpnpOpt = Annotated[bool | None, typer.Option("--upnp/--no-upnp", help=config_help(
    "network.upnp", "ask the router to forward our port by UPnP first, where it offers that"))]
RoleOpt = Annotated[str | None, typer.Option("--role", help=config_help(
    "network.role", "peer (SAPO) | learner | worker (ECHO-2)"))]
LearnerOpt = Annotated[str | None, typer.Option("--learner", help="worker: peer id of the learner to follow")]
CostOpt = Annotated[float | None, typer.Option("--cost-per-hour", help=config_help(
    "echo.cost_per_hour", "worker: its price, told to the learner"))]
LocalGroupsOpt = Annotated[int | None, typer.Option("--local-groups", help=config_help(
    "share.local_groups", "I: local groups per update (0: --prompts-per-step)"))]
ExternalGroupsOpt = Annotated[int | None, typer.Option("--external-groups", help=config_help(
    "share.external_groups", "J: external groups per update"))]
MaxAgeOpt = Annotated[int | None, typer.Option("--max-external-age", help=config_help(
    "share.max_external_age", "K: drop external groups older than K of our steps"))]
FilterOpt = Annotated[bool | None, typer.Option("--filter-no-signal/--no-filter-no-signal", help=config_help(
    "share.filter_no_signal", "refuse peers' groups without signal (SAPO's zero-advantage filter; off: an ablation)"))]
CorrectionOpt = Annotated[str | None, typer.Option("--external-correction", help=config_help(
    "share.correction.kind", f"how peers' completions are weighted: {' | '.join(variants.CORRECTIONS)}"))]


@app.command()
def join(bootstrap: BootstrapOpt = None, listen: ListenOpt = None, announce_addr: AnnounceOpt = None,
         identity: IdentityOpt = None, role: RoleOpt = None, local_groups: LocalGroupsOpt = None,
         external_groups: ExternalGroupsOpt = None, max_external_age: MaxAgeOpt = None,
         external_correction: CorrectionOpt = None, filter_no_signal: FilterOpt = None, config: ConfigOpt = None,
         steps: StepsOpt = None, task: TaskOpt = None, task_option: TaskOptionOpt = None, model: ModelOpt = None,
         group_size: GroupOpt = None, prompts_per_step: PromptsOpt = None, seed: SeedOpt = None,
         run_dir: RunDirOpt = None, resume: ResumeOpt = False, sampler: SamplerOpt = None, lr: LrOpt = None,
         minibatches: MinibatchOpt = None, checkpoint_every: CkptOpt = None,
         checkpoint_every_s: CkptSecondsOpt = None, eval_problems: EvalOpt = None,
         status_port: StatusPortOpt = None, status_host: StatusHostOpt = None,
         status_token: StatusTokenOpt = None, learner: LearnerOpt = None,
         max_staleness: StalenessOpt = None, cost_per_hour: CostOpt = None, device: DeviceOpt = None,
         memory_budget: BudgetOpt = None, relay: RelayOpt = None, upnp: UpnpOpt = None,
         max_new_tokens: MaxNewTokensOpt = None, max_model_len: MaxModelLenOpt = None,
         temperature: TemperatureOpt = None, lora_rank: LoraRankOpt = None,
         prompt_format: PromptFormatOpt = None) -> None:
    """Join a swarm over libp2p: as a peer, share rollouts and train on theirs (SAPO); as a learner or a worker
    following one (--role, --learner), the ECHO-2 mode. Prints the address others can join through; without
    --bootstrap it starts a new swarm."""
    params = dict(locals())  # the flags, by parameter name: cli/options.NODE_KEYS maps them to config keys
    with user_errors():
        from swarm_node.config import load_config
        from swarm_node.status.stats import NodeStats

        overrides = node_overrides(params)
        if run_dir is None and config is None:
            overrides["run.run_dir"] = "runs/peer"
        cfg = load_config(config, overrides)
        configure_logging()
        stats = NodeStats(role=cfg.network.role)
        server = start_status_server(stats, cfg.status.host, cfg.status.port, cfg.status.token)
        try:
            from swarm_node.roles import ROLES

            run_with_progress(cfg, stats, ROLES[cfg.network.role])
        finally:
            if server is not None:
                server.stop()


@app.command()
def keygen(path: Annotated[Path, typer.Argument(help="where to write the Ed25519 key")] = Path("identity.key"),
           force: Annotated[bool, typer.Option("--force", help="overwrite an existing key")] = False) -> None:
    """Create a persistent libp2p identity (Ed25519 key, mode 0600) and print its peer id."""
    with user_errors():
        from swarm_node.identity import keygen as make_key

        identity = make_key(path, overwrite=force)
        typer.echo(f"{identity.peer_id}  ({path})")


@app.command()
def status(url: Annotated[str, typer.Argument(help="the node's status URL")] = "http://127.0.0.1:8470/",
           token: Annotated[str | None, typer.Option("--token", envvar="SWARM_NODE_STATUS_TOKEN",
                                                     help="bearer token printed by the node")] = None,
           ) -> None:
    """Show a running node's status as tables (what its /status endpoint says)."""
    with user_errors():
        from cli.status_cmd import print_status

        print_status(url, token)


@app.command()
def simulate(scenario: Annotated[Path, typer.Argument(help="scenario TOML")],
             run_dir: Annotated[Path | None, typer.Option("--run-dir", help="output directory")] = None,
             rounds: Annotated[int | None, typer.Option("--rounds", help="override the scenario's rounds")] = None,
             seed: Annotated[list[int] | None, typer.Option("--seed", help="override the scenario's seeds")] = None,
             transport: Annotated[str | None, typer.Option("--transport", help="override the scenario's transport: "
                                                           "memory (network model) | libp2p (real, loopback)")] = None,
             device: DeviceOpt = None, prompt_format: PromptFormatOpt = None) -> None:
    """Run many nodes on this machine over a modelled network; writes CSV, plots and a summary table."""
    with user_errors():
        from cli.simulate_cmd import run_simulate

        run_simulate(scenario, run_dir, rounds, seed, transport, device, prompt_format)


@app.command()
def plan(config: Annotated[Path | None, typer.Option("--config", help="plan TOML: learner, network, workers "
                                                                       "tables")] = None,
         from_run: Annotated[Path | None, typer.Option("--from-run", help="a node's run dir: measured step "
                                                                          "time and groups per step")] = None,
         step_s: Annotated[float | None, typer.Option("--step-s", help="learner training s/step")] = None,
         rollouts_per_step: Annotated[float | None, typer.Option("--rollouts-per-step")] = None,
         delta_mb: Annotated[float | None, typer.Option("--delta-mb", help="bytes per delta, in MB")] = None,
         kappa: Annotated[int | None, typer.Option("--kappa", help="publish every kappa steps [1]")] = None,
         max_staleness: Annotated[int | None, typer.Option("--max-staleness", help="cap on S")] = None,
         bandwidth_mb_s: Annotated[float | None, typer.Option("--bandwidth-mb-s", help="link MB/s")] = None,
         chunk_mb: Annotated[float | None, typer.Option("--chunk-mb", help="broadcast chunk [1]")] = None,
         schedule: Annotated[str | None, typer.Option("--schedule", help="chain|tree:f|star|stripe:f")] = None,
         worker: Annotated[list[str] | None, typer.Option("--worker", help="NAME:ROLLOUTS_PER_S:COST_PER_HOUR"
                                                                           "[:MB_S], replaces the file's")] = None,
         as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False) -> None:
    """Cheapest workers that keep a learner busy, dissemination latency, smallest staleness bound (docs/PLANNING.md).
    Exit 1 if the demand cannot be met."""
    with user_errors():
        from cli.plan_cmd import run_plan

        run_plan(config, from_run, {
            "learner.step_s": step_s, "learner.rollouts_per_step": rollouts_per_step, "learner.delta_mb": delta_mb,
            "learner.kappa": kappa, "learner.max_staleness": max_staleness, "network.bandwidth_mb_s": bandwidth_mb_s,
            "network.chunk_mb": chunk_mb, "network.schedule": schedule}, worker, as_json)


if __name__ == "__main__":
    app()
