"""The environment a run's job is started with: the one its `run` command had, recorded in the run's
folder (``environment.json``, 0600 in a 0700 folder: it may hold tokens, so it is never printed and
never in `status --json`) and given to every attempt, automatic or continued (`restart`, `adopt`),
whoever continues the run and from whatever shell. `restart --env` changes it from then on.

Slurm's variables describe the allocation the job runs in now, not the run: they come from the
shell that continues it (none outside an allocation), and inside one so do the GPUs it was given."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from trainguard.errors import UsageError
from trainguard.paths import open_private

FILE_NAME = "environment.json"

# Set by Slurm for each allocation (gres/gpu sets the device lists): a continuation inside an allocation
# takes them from there, as it would be stale to keep those of the allocation the run was started in.
ALLOCATION_PREFIX = "SLURM_"
ALLOCATION_GPUS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


def path_of(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / FILE_NAME


def record(run_dir: str | os.PathLike[str], environ: Mapping[str, str]) -> None:
    """Write the job's environment for every attempt from now on, whole or not at all (a new file
    put in place of the old one)."""
    target = path_of(run_dir)
    partial = target.with_name(f".{FILE_NAME}.{os.getpid()}")
    try:
        with open_private(partial) as out:  # ensure_ascii: a value that is no UTF-8 comes back byte for byte
            json.dump(dict(environ), out)
        os.replace(partial, target)
    except OSError as exc:
        raise UsageError(f"cannot record the run's environment in {target}: {exc.strerror or exc}",
                         f"无法在 {target} 中记录运行的环境：{exc.strerror or exc}") from None  # fmt: skip
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def recorded(run_dir: str | os.PathLike[str]) -> dict[str, str] | None:
    """The recorded environment; None for a run that has none (recorded by an older trainguard)."""
    path = path_of(run_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read the run's recorded environment {path}: {exc.strerror}",
                         f"无法读取运行记录的环境 {path}：{exc.strerror}") from None  # fmt: skip
    try:
        environ = json.loads(text)
    except ValueError:
        environ = None
    if not isinstance(environ, dict) or not all(isinstance(v, str) for v in environ.values()):
        raise UsageError(f"the run's recorded environment {path} is damaged: continue the run with "
                         "`trainguard run --name NAME -- CMD` from a shell with the environment it needs",
                         f"运行记录的环境 {path} 已损坏：请在具备所需环境的 shell 中用 "
                         "`trainguard run --name NAME -- CMD` 继续该运行")  # fmt: skip
    return environ


def job_base(run_dir: str | os.PathLike[str]) -> Mapping[str, str]:
    """What an attempt's environment starts from: the recorded one, else (a run recorded by an older
    trainguard) this process's, as then."""
    environ = recorded(run_dir)
    return os.environ if environ is None else environ


def parse_env_changes(assignments: Iterable[str], removals: Iterable[str]) -> dict[str, str | None]:
    """``--env KEY=VALUE`` (``KEY=`` sets it empty: ``CUDA_VISIBLE_DEVICES=`` hides every GPU) and
    ``--unset-env KEY``, as name -> value, None to remove; a later --env of a name wins."""
    changes: dict[str, str | None] = {}
    for item in assignments:
        name, equals, value = item.partition("=")
        if not equals or not _is_name(name):  # the name only: what follows = may be a secret
            raise UsageError(f"--env {name!r}: use --env KEY=VALUE (KEY= sets it empty)",
                             f"--env {name!r}：格式为 --env KEY=VALUE（KEY= 表示设为空）")  # fmt: skip
        changes[name] = value
    for name in removals:
        if not _is_name(name):
            shown = name.partition("=")[0]
            raise UsageError(f"--unset-env {shown!r}: give the name of a variable alone, without =",
                             f"--unset-env {shown!r}：只给出变量名，不带 =")  # fmt: skip
        if name in changes:
            raise UsageError(f"--env and --unset-env both name {name}: give one",
                             f"--env 与 --unset-env 都指定了 {name}：只能给一个")  # fmt: skip
        changes[name] = None
    return changes


def _is_name(name: str) -> bool:
    return bool(name) and "=" not in name and "\0" not in name


def continued(recorded_environ: Mapping[str, str], caller: Mapping[str, str],
              changes: Mapping[str, str | None]) -> dict[str, str]:  # fmt: skip
    """The environment a continued run records: its own, with the allocation's variables of the
    shell that continues it (see the module's docstring), then ``changes``."""
    environ = {k: v for k, v in recorded_environ.items() if not k.startswith(ALLOCATION_PREFIX)}
    environ.update((k, v) for k, v in caller.items() if k.startswith(ALLOCATION_PREFIX))
    if caller.get("SLURM_JOB_ID"):
        for name in ALLOCATION_GPUS:
            environ.pop(name, None)
            if name in caller:
                environ[name] = caller[name]
    for name, value in changes.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return environ
