"""The ``trainguard`` command. Errors a person can cause end as one line on stderr and exit 2."""

from __future__ import annotations

import importlib
import os
import sys

import click

from trainguard import __version__
from trainguard._i18n import choose_language
from trainguard.cli import errors_zh
from trainguard.cli.help_zh import ROOT, HelpContext, language_in, localize, set_language
from trainguard.errors import TrainguardError, UsageError

# Each command's module is imported only when that command runs: `trainguard diagnose` should not pay
# for the supervisor, the exporter and psutil (a third of its start-up before this table).
_COMMANDS = {
    "adopt": "trainguard.cli.runs",
    "demo": "trainguard.cli.demo",
    "diagnose": "trainguard.cli.diagnose",
    "doctor": "trainguard.cli.doctor",
    "exporter": "trainguard.cli.exporter",
    "logs": "trainguard.cli.logs",
    "prune": "trainguard.cli.remove",
    "ps": "trainguard.cli.status",
    "report": "trainguard.cli.status",
    "restart": "trainguard.cli.runs",
    "rm": "trainguard.cli.remove",
    "run": "trainguard.cli.runs",
    "status": "trainguard.cli.status",
    "stop": "trainguard.cli.stop",
    "top": "trainguard.cli.top",
}


class _LazyGroup(click.Group):
    # Help in the language of the command line (--help in Chinese: cli/help_zh.py).
    context_class = HelpContext

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        set_language(ctx, language_in(args, os.environ))
        localize(self, ROOT, ctx)
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*_COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _COMMANDS:
            self.add_command(getattr(importlib.import_module(_COMMANDS[cmd_name]), cmd_name))
        command = self.commands.get(cmd_name)
        if command is not None:
            localize(command, cmd_name, ctx)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="trainguard")
def cli() -> None:
    """trainguard keeps GPU training jobs alive.

    \b
    trainguard demo              the whole story on a toy job with real faults (about 30 s)
    trainguard run -- CMD        run a job detached, watched, restarted and resumed
    trainguard ps / status RUN   runs, their attempts and causes of death
    trainguard logs RUN [-f]     a run's output
    trainguard stop RUN          stop it, with time for a last checkpoint
    trainguard restart RUN       continue an ended run in place, from its newest checkpoint
    trainguard rm RUN / prune    remove ended runs (records, logs; checkpoints when asked)
    trainguard adopt RUN         watch again a job whose supervisor died
    trainguard diagnose LOG      why did it die: the cause, the lines that prove it, the fix
    trainguard doctor            what will kill it, before it does
    trainguard exporter          Prometheus metrics of runs, GPUs and the host
    trainguard report RUN        an HTML timeline of a run: resources, attempts, causes
    trainguard top               a live view of the runs, GPUs and host (keys: log, diagnosis, stop)
    """


def _require_separator(args: list[str]) -> None:
    """`trainguard run python train.py --lr 1` would read the job's options as ours: insist on --."""
    if args[:1] == ["run"] and "--" not in args and not {"-h", "--help"} & set(args):
        raise UsageError(
            "put -- before the job's command: trainguard run [OPTIONS] -- CMD [ARGS]...",
            "请在作业命令前加 --：trainguard run [选项] -- 命令 [参数]...",
        )


def _click_message_zh(exc: click.ClickException, message: str) -> str:
    """Click speaks English: its errors in Chinese (data/click_errors_zh.toml), else what it said
    quoted in a Chinese frame."""
    translated = errors_zh.translate(message)
    if translated is not None:
        return translated
    if isinstance(exc, click.BadParameter):
        return f"参数值无效：「{message}」"
    if isinstance(exc, click.UsageError):
        return f"用法错误：「{message}」"
    return f"「{message}」"


def _fail(message: str, code: int) -> int:
    click.echo(f"trainguard: {message}", err=True)
    return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    lang = language_in(args, os.environ)  # a command's --lang speaks its errors too
    try:
        _require_separator(args)
        result = cli.main(args=args, prog_name="trainguard", standalone_mode=False, obj={"argv": args})
    except TrainguardError as exc:
        return _fail(exc.message(lang), exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return 2
    except click.ClickException as exc:
        message = exc.format_message().replace("\n", " ")
        return _fail(_click_message_zh(exc, message) if lang == "zh" else message, exc.exit_code)
    except click.exceptions.Abort:
        return _fail("interrupted" if lang == "en" else "已中断", 130)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrokenPipeError:
        # `trainguard diagnose ... | head`: the reader left; that is not an error of ours.
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        return _fail("interrupted" if lang == "en" else "已中断", 130)
    except OSError as exc:
        # What the commands do not expect is most often their own output failing: `trainguard logs
        # RUN > saved.log` on a full disk. One line, never a traceback.
        _silence_stdout()
        return _fail(_os_error(exc, lang), 1)
    return result if isinstance(result, int) else 0


def _os_error(exc: OSError, lang: str) -> str:
    reason = exc.strerror or str(exc)
    if exc.filename:
        return f"cannot write {exc.filename}: {reason}" if lang == "en" else f"无法写入 {exc.filename}：{reason}"
    return f"cannot write the output: {reason}" if lang == "en" else f"无法写出输出：{reason}"


def _silence_stdout() -> None:
    """Nothing more reaches a standard output that failed, not even the interpreter's last flush
    (which would print its own traceback)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def entry() -> None:
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    except OSError as exc:
        _silence_stdout()
        code = _fail(_os_error(exc, choose_language(None, os.environ)), 1)
    sys.exit(code)


if __name__ == "__main__":
    entry()
