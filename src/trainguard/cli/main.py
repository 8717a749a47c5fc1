"""The ``trainguard`` command. Errors a person can cause end as one line on stderr and exit 2."""

from __future__ import annotations

import os
import sys

import click

from trainguard import __version__
from trainguard._i18n import choose_language
from trainguard.errors import TrainguardError, UsageError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="trainguard")
def cli() -> None:
    """trainguard keeps GPU training jobs alive.

    \b
    trainguard demo              the whole story on a toy job with real faults (a minute)
    trainguard run -- CMD        run a job detached, watched, restarted and resumed
    trainguard ps / status RUN   runs, their attempts and causes of death
    trainguard logs RUN [-f]     a run's output
    trainguard stop RUN          stop it, with time for a last checkpoint
    trainguard restart RUN       continue an ended run in place, from its newest checkpoint
    trainguard adopt RUN         watch again a job whose supervisor died
    trainguard diagnose LOG      why did it die: the cause, the lines that prove it, the fix
    trainguard doctor            what will kill it, before it does
    trainguard exporter          Prometheus metrics of runs, GPUs and the host
    trainguard report RUN        an HTML timeline of a run: resources, attempts, causes
    trainguard top               a live view of the runs, GPUs and host (keys: log, diagnosis, stop)
    """


def _register() -> None:
    from trainguard.cli.demo import demo
    from trainguard.cli.diagnose import diagnose
    from trainguard.cli.doctor import doctor
    from trainguard.cli.runs import adopt, exporter, logs, ps, report, restart, run, status, stop
    from trainguard.cli.top import top

    for command in (demo, run, ps, status, logs, stop, restart, adopt, diagnose, doctor, exporter, report, top):
        cli.add_command(command)


def _require_separator(args: list[str]) -> None:
    """`trainguard run python train.py --lr 1` would read the job's options as ours: insist on --."""
    if args[:1] == ["run"] and "--" not in args and not {"-h", "--help"} & set(args):
        raise UsageError(
            "put -- before the job's command: trainguard run [OPTIONS] -- CMD [ARGS]...",
            "请在作业命令前加 --：trainguard run [选项] -- 命令 [参数]...",
        )


def _fail(message: str, code: int) -> int:
    click.echo(f"trainguard: {message}", err=True)
    return code


def main(argv: list[str] | None = None) -> int:
    _register()
    lang = choose_language(None, os.environ)
    try:
        args = sys.argv[1:] if argv is None else argv
        _require_separator(args)
        result = cli.main(args=args, prog_name="trainguard", standalone_mode=False, obj={"argv": args})
    except TrainguardError as exc:
        return _fail(exc.message(lang), exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        return 2
    except click.ClickException as exc:
        return _fail(exc.format_message().replace("\n", " "), exc.exit_code)
    except click.exceptions.Abort:
        return _fail("interrupted" if lang == "en" else "已中断", 130)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrokenPipeError:
        # `trainguard diagnose ... | head`: the reader left; that is not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return _fail("interrupted" if lang == "en" else "已中断", 130)
    return result if isinstance(result, int) else 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
