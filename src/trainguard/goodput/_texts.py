"""The lines a person reads about a run's goodput, in English and Chinese."""

from __future__ import annotations

from trainguard._i18n import Text
from trainguard.goodput._records import Goodput, Loss
from trainguard.units import format_duration as d


def steps_text(count: int, lang: str = "en") -> str:
    """Steps as a person reads them: "1 step", "143 steps", "143 步"."""
    return Text(f"{count} step" if count == 1 else f"{count} steps", f"{count} 步").pick(lang)


def describe(result: Goodput, lang: str = "en") -> str:
    """One line a person reads: the ratio (or that it is unknown), the wall time, what the losses
    were, and in a run still going how much training is not in a checkpoint yet."""
    if result.wall_s <= 0:
        return Text("no attempt has run yet", "尚无已运行的尝试").pick(lang)
    wall, restart, stalled = d(result.wall_s), d(result.restart_s), d(result.stalled_s)
    if result.ratio is None:
        text = Text(f"unknown: the job reports neither its steps nor checkpoints ({wall} wall time)",
                    f"未知：作业既不报告步数也不报告检查点（墙钟时间 {wall}）").pick(lang)  # fmt: skip
        lost = Text(f"; lost: {restart} restarting", f"；损失：重启 {restart}").pick(lang)
        return text + (lost if result.restart_s else "")
    pct, kept = f"{100 * result.ratio:.0f}%", d(result.kept_s)
    text = Text(f"{pct}{' so far' if result.active else ''} ({kept} of training kept in {wall} wall time",
                f"{'目前 ' if result.active else ''}{pct}（墙钟时间 {wall} 中保留的训练 {kept}").pick(lang)  # fmt: skip
    if result.unsaved_s > 0:
        unsaved = d(result.unsaved_s)
        if result.unsaved_steps:
            unsaved += Text(" ({})", "（{}）").pick(lang).format(steps_text(result.unsaved_steps, lang))
        text += Text(f"; {unsaved} of training not in a checkpoint yet", f"；{unsaved}的训练尚未存入检查点").pick(lang)
    text += Text(")", "）").pick(lang)
    if not any(result.lost_by_kind().values()):
        return text
    never_saved = result.never_saved_s
    redone = result.recomputed_s - never_saved
    work = Text(f"{d(redone)} recomputed, ", f"重算 {d(redone)}，").pick(lang) if redone or not never_saved else ""
    if never_saved:
        work += Text(f"{d(never_saved)} never saved, ", f"未保存 {d(never_saved)}，").pick(lang)
    return text + Text(f"; lost: {work}{restart} restarting, {stalled} stalled",
                       f"；损失：{work}重启 {restart}，停滞 {stalled}").pick(lang)  # fmt: skip


def describe_loss(loss: Loss, lang: str = "en") -> str:
    """One attempt's end: its cause (or a stop), the work recomputed or never saved, restart, stall."""
    recomputed, restart, stalled = d(loss.recomputed_s), d(loss.restart_s), d(loss.stalled_s)
    steps = ""
    if loss.recomputed_steps:
        steps = Text(" ({})", "（{}）").pick(lang).format(steps_text(loss.recomputed_steps, lang))
    work = Text("recomputed", "重算") if loss.redone else Text("never saved", "未保存")
    return Text(f"attempt {loss.attempt} ({loss.cause or 'stopped on request'}): {recomputed} {work.en}{steps}, "
                f"{restart} restarting, {stalled} stalled",
                f"第 {loss.attempt} 次尝试（{loss.cause or '按请求停止'}）：{work.zh} {recomputed}{steps}，"
                f"重启 {restart}，停滞 {stalled}").pick(lang)  # fmt: skip
