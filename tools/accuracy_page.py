"""docs/accuracy.md and docs/accuracy.zh-CN.md from the figures of tools/accuracy.py: the same page in
English and in Chinese. Only figures and the catalogue's ids go in, so the text is the same on every
machine."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tools.accuracy import CONFIDENT, Action, Band, Figures, Judged, Target, against_targets, share
from trainguard.supervisor.policy import SURE_ENOUGH_TO_END

PAGES = {"en": "docs/accuracy.md", "zh": "docs/accuracy.zh-CN.md"}

TEXT = {
    "en": {
        "title": "# How often the diagnosis is right",
        "breadcrumb": (
            "[trainguard](../README.md) › [Documentation](README.md) · 中文：[accuracy.zh-CN.md](accuracy.zh-CN.md)"
        ),
        "intro": (
            "Measured on the real crash logs of [`tests/corpus`](../tests/corpus/README.md), each labelled by the\n"
            "root cause its public issue thread established and reviewed blind. Every log is diagnosed as\n"
            "`tests/unit/test_corpus.py` does (its text and, where the thread gives it, its exit status, through\n"
            "`trainguard.postmortem.investigate` and the shipped signature table), and the cause named is\n"
            "compared with the label. The held-out part was never read to tune a signature: it is what a new\n"
            "log should expect. The tuning part is what the signatures were reviewed against; its figures are\n"
            "higher for that reason."
        ),
        "generated": (
            "Written by `python -m tools.gen_accuracy`; do not edit it by hand: `tests/unit/test_accuracy_doc.py`\n"
            "fails when this page is not what the corpus and the engine give now."
        ),
        "targets_heading": "## The targets of issue 22, on the held-out part",
        "targets_header": "| figure | target | measured | met |",
        "confident_precision": f"right at confidence >= {CONFIDENT}",
        "coverage": f"coverage: answered at confidence >= {CONFIDENT}",
        "accuracy": "right overall",
        "costly_share": "costly mistakes, both ways",
        "yes": "yes",
        "no": "no",
        "costly_meaning": (
            "A costly mistake makes the supervisor act wrongly, not only print a wrong name: the root cause is\n"
            "worth a restart and the cause named ends the run (it ends when it should have gone on), or the\n"
            "reverse, a restart loop on a bug: the cause named is restarted after every death like it, and the\n"
            "root cause is one a restart cannot cure (a bug or a setting). What the supervisor does is its own\n"
            "decision (`trainguard.supervisor.policy.decide`, default policy) after a death named so, at the\n"
            "confidence named; what the root cause needs is that decision at confidence 1. A cause that ends the\n"
            f"run is acted on only at confidence >= {SURE_ENOUGH_TO_END}: below, it is restarted once, "
            "as `unknown` is. A wrong\n"
            "name with the same decision (`cuda_oom` named `host_oom`: both restarted) costs no more than its\n"
            "message; one restart on a bug (a cause restarted once: `unknown`, `segfault`, an unsure name)\n"
            "costs one attempt, and is counted apart below.\n"
            "\n"
            "- restarted: {restart}\n"
            "- restarted once: {once}\n"
            "- the run ends: {end}"
        ),
        "part_heading": {
            "holdout": "## Held-out part: {logs} logs, never tuned against",
            "dev": "## Tuning part: {logs} logs, the signatures were reviewed against them",
        },
        "right_overall": "- right overall: {value}",
        "coverage_line": f"- answered at confidence >= {CONFIDENT} (coverage): {{value}}",
        "confident_line": f"- right when the confidence is >= {CONFIDENT}: {{value}}",
        "costly_line": (
            "- costly mistakes: {count} ({share}): {stopped} runs ended that should have gone on, "
            "{restarted} restart loops on a cause a restart cannot cure\n"
            "- one restart on a cause a restart cannot cure (not costly): {once}"
        ),
        "calibration_heading": "### Calibration: how often each confidence is right",
        "calibration_header": "| confidence | logs | right |",
        "stopped_heading": "### Costly: the run ends when it should have gone on",
        "restarted_heading": "### Costly: a restart loop on a cause a restart cannot cure",
        "once_heading": "### Not costly: one restart on a cause a restart cannot cure",
        "mistakes_header": "| log | root cause (needs) | named (the supervisor) | confidence |",
        "action": {"restart": "restarts", "once": "restarts once", "end": "ends the run"},
        "none": "None.",
        "per_cause_heading": "### Per cause",
        "per_cause_header": "| cause | logs | named so | right | precision | recall |",
        "of": " ({right} of {total})",
        "list_separator": ", ",
        "percent": "{value} %",
    },
    "zh": {
        "title": "# 诊断多常判对",
        "breadcrumb": (
            "[trainguard](../README.zh-CN.md) › [文档](README.zh-CN.md) · English: [accuracy.md](accuracy.md)"
        ),
        "intro": (
            "在 [`tests/corpus`](../tests/corpus/README.md) 的真实崩溃日志上测得：每份日志按其公开 issue\n"
            "讨论所确认的根因标注，并经盲审复核。每份日志都按 `tests/unit/test_corpus.py` 的方式诊断\n"
            "（日志文本，以及讨论中给出的退出状态，经 `trainguard.postmortem.investigate` 和随包发布的\n"
            "特征表），再把诊断出的原因与标注比较。保留部分从未用于调整任何特征：它代表新日志能期待的\n"
            "结果。调整部分是特征复核时对照的日志，因此数字更高。"
        ),
        "generated": (
            "由 `python -m tools.gen_accuracy` 生成，请勿手工编辑：本页与当前语料和引擎得出的结果不一致时，\n"
            "`tests/unit/test_accuracy_doc.py` 会失败。"
        ),
        "targets_heading": "## issue 22 的目标（保留部分）",
        "targets_header": "| 指标 | 目标 | 实测 | 达到 |",
        "confident_precision": f"置信度 >= {CONFIDENT} 时的正确率",
        "coverage": f"覆盖率：置信度 >= {CONFIDENT} 的回答",
        "accuracy": "总体正确率",
        "costly_share": "代价高的误判（两个方向合计）",
        "yes": "是",
        "no": "否",
        "costly_meaning": (
            "代价高的误判会让监督进程做错事，而不只是报错名字：根因值得重启，而诊断出的原因会结束运行\n"
            "（本应继续的运行就此结束）；或者反过来，在 bug 上循环重启：诊断出的原因每次终止后都重启，\n"
            "而根因是重启无法解决的（bug 或设置错误）。监督进程怎么做，由它自己的决策\n"
            "（`trainguard.supervisor.policy.decide`，默认策略）按诊断出的原因和置信度决定；根因需要的做法\n"
            f"是置信度为 1 时的同一决策。会结束运行的原因只在置信度 >= {SURE_ENOUGH_TO_END} 时照办："
            "低于它时重启一次，\n"
            "与 `unknown` 相同。决策相同的错名（`cuda_oom` 被判为 `host_oom`：两者都重启）只是消息错了；\n"
            "在 bug 上重启一次（只重启一次的原因：`unknown`、`segfault`、不确定的诊断）只多花一次尝试，\n"
            "在下面单独计数。\n"
            "\n"
            "- 重启：{restart}\n"
            "- 重启一次：{once}\n"
            "- 结束运行：{end}"
        ),
        "part_heading": {
            "holdout": "## 保留部分：{logs} 份日志，从未用于调整",
            "dev": "## 调整部分：{logs} 份日志，特征复核时对照过",
        },
        "right_overall": "- 总体正确率：{value}",
        "coverage_line": f"- 置信度 >= {CONFIDENT} 的回答（覆盖率）：{{value}}",
        "confident_line": f"- 置信度 >= {CONFIDENT} 时的正确率：{{value}}",
        "costly_line": (
            "- 代价高的误判：{count}（{share}）：{stopped} 次本应继续的运行被结束，"
            "{restarted} 次在重启无法解决的原因上循环重启\n"
            "- 在重启无法解决的原因上只重启一次（不算代价高）：{once}"
        ),
        "calibration_heading": "### 校准：各置信度区间的正确率",
        "calibration_header": "| 置信度 | 日志数 | 正确 |",
        "stopped_heading": "### 代价高：本应继续的运行被结束",
        "restarted_heading": "### 代价高：在重启无法解决的原因上循环重启",
        "once_heading": "### 不算代价高：在重启无法解决的原因上只重启一次",
        "mistakes_header": "| 日志 | 根因（需要） | 诊断为（监督进程） | 置信度 |",
        "action": {"restart": "重启", "once": "重启一次", "end": "结束运行"},
        "none": "无。",
        "per_cause_heading": "### 按原因",
        "per_cause_header": "| 原因 | 日志数 | 诊断为该原因 | 正确 | 精确率 | 召回率 |",
        "of": "（{total} 份中 {right} 份）",
        "list_separator": "、",
        "percent": "{value}%",
    },
}


def render(parts: Mapping[str, Figures], action: Callable[[str, float], Action], cause_ids: Sequence[str],
           lang: str) -> str:  # fmt: skip
    """``parts``: "holdout" and "dev" figures; ``action``: what the policy does after a death named a
    cause at a confidence (tools.accuracy.policy_action); ``cause_ids``: the catalogue's, in order."""
    text = TEXT[lang]
    out = [text["title"], text["breadcrumb"], text["intro"], text["generated"]]
    out += [text["targets_heading"], _targets_table(against_targets(parts["holdout"]), text)]
    lists = {kind.value: _ids([c for c in cause_ids if action(c, 1.0) is kind], text) for kind in Action}
    out.append(text["costly_meaning"].format(**lists))
    for part, figures in parts.items():
        out += _part(part, figures, action, text)
    return "\n\n".join(out) + "\n"


def _part(part: str, figures: Figures, action: Callable[[str, float], Action], text: dict) -> list[str]:
    summary = [
        text["right_overall"].format(value=_share(*figures.fraction("accuracy"), text)),
        text["coverage_line"].format(value=_share(*figures.fraction("coverage"), text)),
        text["confident_line"].format(value=_share(*figures.fraction("confident_precision"), text)),
        text["costly_line"].format(
            count=figures.costly,
            share=_percent(share(*figures.fraction("costly_share")), text),
            stopped=len(figures.stopped_wrongly),
            restarted=len(figures.restarted_wrongly),
            once=len(figures.restarted_once),
        ),
    ]
    return [
        text["part_heading"][part].format(logs=figures.logs),
        "\n".join(summary),
        text["calibration_heading"],
        _table(text["calibration_header"], "| --- | ---: | ---: |", [_band_row(b, text) for b in figures.bands]),
        text["stopped_heading"],
        _mistakes(figures.stopped_wrongly, action, text),
        text["restarted_heading"],
        _mistakes(figures.restarted_wrongly, action, text),
        text["once_heading"],
        _mistakes(figures.restarted_once, action, text),
        text["per_cause_heading"],
        _table(
            text["per_cause_header"],
            "| --- | ---: | ---: | ---: | ---: | ---: |",
            [
                f"| `{c.cause}` | {c.logs} | {c.called} | {c.right} | {_percent(c.precision, text)} | "
                f"{_percent(c.recall, text)} |"
                for c in figures.causes
            ],
        ),
    ]


def _targets_table(targets: Sequence[Target], text: dict) -> str:
    rows = [
        f"| {text[t.figure]} | {'>=' if t.at_least else '<='} {_percent(t.goal, text, digits=0)} | "
        f"{_share(t.part, t.whole, text)} | {text['yes'] if t.met else text['no']} |"
        for t in targets
    ]
    return _table(text["targets_header"], "| --- | --- | --- | --- |", rows)


def _mistakes(rows: Sequence[Judged], action: Callable[[str, float], Action], text: dict) -> str:
    if not rows:
        return text["none"]
    said = text["action"]
    lines = [
        f"| `{r.id}` | `{r.label}` ({said[action(r.label, 1.0).value]}) | `{r.cause}` "
        f"({said[action(r.cause, r.confidence).value]}) | {r.confidence:.2f} |"
        for r in sorted(rows, key=lambda r: r.id)
    ]
    return _table(text["mistakes_header"], "| --- | --- | --- | ---: |", lines)


def _band_row(band: Band, text: dict) -> str:
    closing = "]" if band.high == 1.0 else ")"
    return f"| [{band.low:.2f}, {band.high:.2f}{closing} | {band.logs} | {_share(band.right, band.logs, text)} |"


def _table(header: str, rule: str, rows: Sequence[str]) -> str:
    return "\n".join([header, rule, *rows])


def _share(right: int, total: int, text: dict) -> str:
    if not total:
        return "—"
    return _percent(share(right, total), text) + text["of"].format(right=right, total=total)


def _percent(value: float | None, text: dict, digits: int = 1) -> str:
    if value is None:
        return "—"
    return text["percent"].format(value=f"{100 * value:.{digits}f}")


def _ids(causes: Sequence[str], text: dict) -> str:
    return text["list_separator"].join(f"`{c}`" for c in causes)
