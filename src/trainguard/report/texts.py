"""Every text a person reads on a run's report, in English and Chinese, and the escaping every recorded
text gets before it goes on the page: its control characters made visible (a bidi override would
reorder what follows)."""

from __future__ import annotations

import html

from trainguard._terminal import visible

# Every text a person reads on the page: (English, Chinese).
TEXTS: dict[str, tuple[str, str]] = {
    "title": ("trainguard · run", "trainguard · 运行"),
    "command": ("command", "命令"),
    "host": ("host", "主机"),
    "state": ("state", "状态"),
    "started": ("started", "开始"),
    "log": ("log", "日志"),
    "gpus": ("GPUs", "GPU"),
    "gpus_sampled": ("sampled", "已采样"),
    "gpus_none": ("none sampled (no NVIDIA GPU visible)", "未采样（看不到 NVIDIA GPU）"),
    "memory_limit": ("memory limit", "内存上限"),
    "no_memory_limit": ("none (--memory-limit not given)", "无（未指定 --memory-limit）"),
    "timeline": ("Timeline", "时间线"),
    "goodput": ("Goodput: what the failures cost", "有效训练率（goodput）：故障的代价"),
    "attempts": ("Attempts", "尝试"),
    "deaths": ("Deaths", "终止"),
    "alerts": ("Alerts", "告警"),
    "none": ("none", "无"),
    "no_death": ("No attempt died.", "没有尝试异常终止。"),
    "evidence": ("Evidence", "证据"),
    "what_to_do": ("What to do", "处理办法"),
    "confidence": ("confidence", "置信度"),
    "attempt": ("attempt", "尝试"),
    "col_n": ("#", "#"),
    "col_started": ("started", "开始"),
    "col_ended": ("ended", "结束"),
    "col_how": ("how", "方式"),
    "col_cause": ("cause", "原因"),
    "col_resumed": ("resumed from", "恢复自"),
    "col_steps": ("steps", "步数"),
    "running": ("running", "运行中"),
    "state_running": ("running", "运行中"),
    "state_restarting": ("restarting", "重启中"),
    "state_succeeded": ("succeeded", "成功"),
    "state_failed": ("failed", "失败"),
    "state_stopped": ("stopped", "已停止"),
    "succeeded": ("finished", "完成"),
    "stopped": ("stopped on request", "按请求停止"),
    "exit": ("exit", "退出码"),
    "signal": ("signal", "信号"),
    "step": ("step", "步"),
    "headline": (
        "of the wall time was training that was kept: {kept} of {wall}",
        "的墙钟时间是保留下来的训练：{wall} 中的 {kept}",
    ),
    "lost_line": (
        "Lost: {recomputed} recomputing steps, {never_saved} never saved, {restart} restarting, "
        "{stalled} stalled before deaths",
        "损失：重算 {recomputed}，未保存 {never_saved}，重启 {restart}，终止前停滞 {stalled}",
    ),
    "row_progress": ("Training progress (step) · ◆ checkpoint", "训练进度（步）· ◆ 检查点"),
    "row_checkpoints": ("Checkpoints (the job reports no steps)", "检查点（作业未报告步数）"),
    "row_rss_limit": ("Job memory (RSS, GiB) against its limit of {limit}", "作业内存（RSS，GiB）与上限 {limit}"),
    "row_rss_host": (
        "Job memory (RSS, GiB) · no limit; host RAM {total}",
        "作业内存（RSS，GiB）· 无上限；主机内存 {total}",
    ),
    "row_host": ("Host RAM available (GiB) of {total}", "主机可用内存（GiB），共 {total}"),
    "row_gpu_memory": ("GPU memory used (GiB) against the card", "GPU 显存占用（GiB）与显存容量"),
    "row_gpu_util": ("GPU utilisation (%)", "GPU 利用率（%）"),
    "row_gpu_temp": ("GPU temperature (°C)", "GPU 温度（°C）"),
    "row_shm": ("/dev/shm used (%) of {total}", "/dev/shm 已用（%），共 {total}"),
    "row_disk": ("Free disk (GiB)", "磁盘剩余空间（GiB）"),
    "no_samples": ("No samples were recorded", "没有记录到采样"),
    "job_rss": ("job RSS", "作业 RSS"),
    "limit": ("limit", "上限"),
    "ram_available": ("RAM available", "可用内存"),
    "swap_used": ("swap used", "已用交换空间"),
    "card": ("card", "显存容量"),
    "run_folder": ("run folder", "运行目录"),
    "checkpoint_folder": ("checkpoints", "检查点目录"),
    "checkpoint": ("checkpoint", "检查点"),
    "alert": ("alert", "告警"),
    "kept": ("training kept", "保留的训练"),
    "recomputed": ("recomputed (steps redone)", "重算（重做的步）"),
    "unsaved": ("trained, not in a checkpoint yet", "已训练、尚未存入检查点"),
    "never_saved": ("never saved", "未保存"),
    "lost_never_saved": ("never saved (the run ended unfinished)", "未保存（运行未完成就结束）"),
    "restart": ("restarting", "重启"),
    "stalled": ("stalled before a death", "终止前停滞"),
    "overhead": ("start-up and shut-down", "启动与退出"),
    "wall": ("wall time", "墙钟时间"),
    "paused": ("paused between a stop and the continuation (not counted)", "停止后到继续前的暂停（不计入）"),
    "loss_cause": ("death", "终止"),
    "loss_recomputed": ("recomputed", "重算"),
    "loss_restart": ("restarting", "重启"),
    "loss_stalled": ("stalled", "停滞"),
    "measured_by": ("measured by", "依据"),
    "by_steps": ("reported steps", "报告的步数"),
    "by_checkpoints": ("checkpoint times", "检查点时间"),
    "by_mixed": ("reported steps and checkpoint times", "报告的步数与检查点时间"),
    "by_unknown": ("unknown: resumed from a checkpoint of unknown step and time", "未知：恢复自步数与时间不明的检查点"),
}


def tr(key: str, lang: str, **values: str) -> str:
    """The text ``key`` in ``lang``, its ``{placeholders}`` filled from ``values``."""
    en, zh = TEXTS[key]
    return (zh if lang == "zh" else en).format(**values)


def escaped(text: object) -> str:
    return html.escape(visible(str(text)))
