"""When to restart a job that died. Pure: outcomes and a policy in, a decision out."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainguard._i18n import Text
from trainguard.causes import Cause, Retry

BACKOFF_BASE_S = 2.0
BACKOFF_CAP_S = 300.0
CRASH_LOOP_DEATHS = 3  # this many deaths in a row without progress end the run
STARTUP_LINES = 20  # output beyond this many lines counts as progress
# Under `run --requeue` in a Slurm job these causes end the run at once (verdict 75) so that Slurm
# requeues the job: a preempted job's node or time is being taken away, a restart here would be
# killed with it. Other causes are retried here first (no wait in the queue) and handed to Slurm
# once the local retries are spent; `--retry CAUSE=no` hands a cause to Slurm at once.
REQUEUE_AT_ONCE = frozenset({"preempted"})
# A cause a restart cannot cure ends the run only when the diagnosis is this sure of it. Below, the
# name is a guess (a generic exception line, a hint): a wrong stop throws the rest of the run away,
# a wrong restart costs one attempt, so it is restarted once, as `unknown` is. On the tuning part of
# tests/corpus, 2 of the 3 such answers below 0.5 were deaths worth a restart (docs/accuracy.md).
SURE_ENOUGH_TO_END = 0.5


@dataclass(frozen=True)
class RestartPolicy:
    mode: str = "on-failure"  # never | on-failure | always
    max_restarts: int = 10
    retry_overrides: Mapping[str, Retry] = field(default_factory=dict)
    backoff_base_s: float = BACKOFF_BASE_S
    backoff_cap_s: float = BACKOFF_CAP_S
    requeue: bool = False  # run --requeue under Slurm: the scheduler, not this node, takes REQUEUE_AT_ONCE
    restart_budgets: Mapping[str, int] = field(default_factory=dict)  # per cause, over the catalogue's


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended, as the policy needs it."""

    exit_code: int | None
    signal: int | None
    cause: str | None
    stopped_by_user: bool = False  # a stop signal ended it: `trainguard stop`'s, or one from outside
    outside_stop_signal: int | None = None  # that signal, where `trainguard stop` did not send it
    new_checkpoint: bool = False
    new_lines: int = 0
    peers_missing: bool = False  # the other nodes of the job never joined this attempt's rendezvous
    confidence: float = 1.0  # how sure the diagnosis is of cause

    @property
    def succeeded(self) -> bool:
        return not self.stopped_by_user and self.exit_code == 0 and self.signal is None and self.cause is None

    @property
    def progressed(self) -> bool:
        return self.new_checkpoint or self.new_lines > STARTUP_LINES


@dataclass(frozen=True)
class Decision:
    restart: bool
    final_state: str | None  # succeeded | failed | stopped, when not restarting
    reason: Text
    delay_s: float = 0.0
    batch_scale: float = 1.0  # multiply TRAINGUARD_BATCH_SCALE by this for the next attempt


def decide(history: Sequence[Outcome], policy: RestartPolicy, causes: Mapping[str, Cause]) -> Decision:
    last = history[-1]
    if last.stopped_by_user:
        return Decision(False, "stopped", stopped_reason(last.outside_stop_signal))
    if last.succeeded:
        if policy.mode == "always" and len(history) - 1 < policy.max_restarts:
            return Decision(True, None, Text("exited 0; --restart always", "正常退出（0）；--restart always"),
                            policy.backoff_base_s)  # fmt: skip
        return Decision(False, "succeeded", Text("exited 0", "正常退出（0）"))
    cause_id = last.cause or "unknown"
    if last.peers_missing:
        # Restarting alone cannot help: the job needs its other nodes. The verdict (75) lets a
        # scheduler start the whole job again.
        return Decision(False, "failed", Text(f"{cause_id}: the other nodes did not join within --peer-timeout",
                                              f"{cause_id}：其他节点没有在 --peer-timeout 内加入"))  # fmt: skip
    if policy.mode == "never":
        return Decision(False, "failed", Text(f"died ({cause_id}); --restart never", f"终止（{cause_id}）；--restart never"))
    if policy.requeue and cause_id in REQUEUE_AT_ONCE:
        return Decision(False, "failed", Text(f"{cause_id}: handed back to Slurm to requeue the job (--requeue)",
                                              f"{cause_id}：交还 Slurm 重新排队（--requeue）"))  # fmt: skip
    restarts = len(history) - 1
    if restarts >= policy.max_restarts:
        return Decision(
            False,
            "failed",
            Text(f"died ({cause_id}) after {restarts} restarts (--max-restarts {policy.max_restarts})",
                 f"已重启 {restarts} 次后仍终止（{cause_id}）（--max-restarts {policy.max_restarts}）"),
        )  # fmt: skip
    cause = causes[cause_id]
    retry = policy.retry_overrides.get(cause_id, cause.retry)
    unsure = cause_id not in policy.retry_overrides and retry is Retry.NO and last.confidence < SURE_ENOUGH_TO_END
    if unsure:
        retry = Retry.ONCE
    if retry is Retry.NO:
        return Decision(False, "failed", Text(f"{cause_id}: a restart cannot help; fix it first",
                                              f"{cause_id}：重启无济于事，请先修复"))  # fmt: skip
    if retry is Retry.ONCE and len(history) >= 2 and history[-2].cause == cause_id and not history[-2].succeeded:
        return Decision(False, "failed", Text(f"{cause_id} twice in a row: not retrying again",
                                              f"连续两次 {cause_id}：不再重试"))  # fmt: skip
    budget = policy.restart_budgets.get(cause_id, cause.restart_budget)
    spent = sum(1 for outcome in history[:-1] if outcome.cause == cause_id)
    if budget is not None and spent >= budget:
        # A cause that comes back after every restart (a leak) is met by a new checkpoint each time,
        # so no crash loop is ever seen: its own budget ends the run.
        return Decision(
            False, "failed",
            Text(f"{cause_id} again after {spent} restarts for it (its budget is {budget}): it comes back after every restart; fix it first",
                 f"重启 {spent} 次后再次出现 {cause_id}（该原因的重启上限为 {budget} 次）：每次重启后都会复发，请先修复"),
        )  # fmt: skip
    deaths_without_progress = 0
    for outcome in reversed(history):
        if outcome.progressed or outcome.succeeded:
            break
        deaths_without_progress += 1
    if deaths_without_progress >= CRASH_LOOP_DEATHS:
        return Decision(
            False, "failed",
            Text(f"crash loop: {deaths_without_progress} deaths in a row without a new checkpoint or output beyond start-up",
                 f"崩溃循环：连续 {deaths_without_progress} 次终止，既没有新检查点，也没有启动之外的输出"),
        )  # fmt: skip
    delay = min(policy.backoff_cap_s, policy.backoff_base_s * 2 ** max(0, deaths_without_progress - 1))
    if cause.restart_at_once:
        delay = 0.0
    reason = Text(f"{cause_id}: restarting", f"{cause_id}：正在重启")
    if unsure:
        reason = Text(f"{cause_id} (confidence {last.confidence:.2f}): not sure enough to end the run; restarting once",
                      f"{cause_id}（置信度 {last.confidence:.2f}）：把握不足，不据此结束运行；重启一次")  # fmt: skip
    return Decision(True, None, reason, cause.retry_pause_s + delay, cause.batch_scale)


_WHEN = {None: ("", ""), "before_start": (" before the attempt started", "在尝试开始前"),
         "backoff": (" while waiting to restart", "在等待重启时")}  # fmt: skip


def stopped_reason(outside_signal: int | None, when: str | None = None) -> Text:
    """Why a run stopped: `trainguard stop` asked, or the stop signal ``outside_signal`` came from
    outside trainguard (a scheduler's, the kubelet's: a preemption, as the verdict of `run
    --foreground` says); ``when``: ``before_start`` or ``backoff`` where no attempt was running."""
    when_en, when_zh = _WHEN[when]
    if outside_signal is None:
        return Text(f"stopped on request{when_en}", f"{when_zh}按请求停止" if when else "已按请求停止")
    name = _signal_name(outside_signal)
    return Text(f"preempted: {name} from outside trainguard{when_en} (a scheduler, the kubelet or the container "
                f"runtime), not `trainguard stop`",
                f"被抢占：{when_zh}收到来自 trainguard 之外的 {name}（调度器、kubelet 或容器运行时），"
                f"不是 trainguard stop")  # fmt: skip


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def verdict_exit_code(final_state: str, last_cause: str | None, causes: Mapping[str, Cause], *,
                      stopped_from_outside: bool = False) -> int:  # fmt: skip
    """How `run --foreground` exits (DESIGN section 5): 0 succeeded (or stopped by `trainguard stop`);
    75 another attempt, node or time may cure it (a stop signal from a scheduler is a preemption);
    78 it needs a fix first; 1 anything else."""
    if final_state == "succeeded":
        return 0
    if final_state == "stopped":
        return causes["preempted"].exit_code if stopped_from_outside else 0
    return causes[last_cause or "unknown"].exit_code
