"""Launchers in a job's command: torchrun (``python -m torch.distributed.run``), ``deepspeed`` and
``accelerate launch``. What the supervisor sets in their environment so that every rank's output and
error file are kept with the attempt, without touching the command line, and where it finds them.

torchrun reads each option from ``PET_<OPTION>`` when the command line does not give it
(``torch.distributed.argparse_util.env``): ``PET_LOG_DIR`` puts every rank's ``stdout.log``,
``stderr.log`` and ``error.json`` under ``<dir>/<rdzv id>_<random>/attempt_<k>/<local rank>/``,
``PET_TEE=3`` keeps copying them to the console (so the attempt's log still has everything, each
line prefixed ``[<role><local rank>]:``), and the agent itself writes the first failure into
``TORCHELASTIC_ERROR_FILE``. ``accelerate launch`` runs torchrun's agent with its own ``--log_dir`` and
``--tee`` defaults, and DeepSpeed's launcher has no log folder unless ``--enable_each_rank_log`` is
given: their ranks' output is in the attempt's log, and each rank's exception in trainguard's own
per-rank error file (``errorfile``).

``recognise`` and ``environment`` are pure; ``rank_files`` and ``worker_identity`` read the disk and
/proc.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard import _untrusted as untrusted
from trainguard.paths import open_private

TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
DEEPSPEED_MODULES = ("deepspeed.launcher.runner",)
# torchrun options that take no value (everything else before the script takes one).
_TORCHRUN_FLAGS = {"standalone", "module", "m", "no-python", "run-path", "virtual-local-rank"}
_SHORT = {"r": "redirects", "t": "tee", "m": "module"}
_TORCH_ATTEMPT = re.compile(r"^attempt_([0-9]+)$")
_EACH_RANK_LOG = re.compile(r"_rank([0-9]+)\.log$")


@dataclass(frozen=True)
class Launcher:
    kind: str  # torchrun | deepspeed | accelerate
    options: Mapping[str, str] = field(default_factory=dict)  # long names, "-" spelled, as given

    def option(self, name: str, env: Mapping[str, str] | None = None) -> str | None:
        """An option's value from the command line, else from torchrun's PET_ variable."""
        if name in self.options:
            return self.options[name]
        if env is not None and self.kind == "torchrun":
            return env.get("PET_" + name.upper().replace("-", "_"))
        return None

    def nodes(self, env: Mapping[str, str] | None = None) -> str | None:
        if self.kind == "torchrun":
            return self.option("nnodes", env)
        if self.kind == "deepspeed":
            return self.option("num-nodes") or ("many" if self.option("hostfile") else None)
        return self.option("num-machines")

    def multi_node(self, env: Mapping[str, str] | None = None) -> bool:
        """Whether the job spans nodes: its ranks on other machines fail and restart with it."""
        nodes = self.nodes(env)
        if not nodes:
            return False
        return nodes.split(":")[-1] not in ("1", "")


def recognise(command: Sequence[str]) -> Launcher | None:
    """The launcher a command starts, with the options it was given before the training script."""
    if not command:
        return None
    program = os.path.basename(command[0])
    rest = list(command[1:])
    if re.match(r"^python[0-9.]*$", program) and rest:
        module, rest = _module(rest)
        if module in TORCHRUN_MODULES:
            return Launcher("torchrun", _options(rest, _TORCHRUN_FLAGS))
        if module in DEEPSPEED_MODULES:
            return Launcher("deepspeed", _options(rest, None))
        if module == "accelerate.commands.launch":
            return Launcher("accelerate", _options(rest, None))
        return None
    if program == "torchrun":
        return Launcher("torchrun", _options(rest, _TORCHRUN_FLAGS))
    if program == "deepspeed":
        return Launcher("deepspeed", _options(rest, None))
    if program == "accelerate" and rest[:1] == ["launch"]:
        return Launcher("accelerate", _options(rest[1:], None))
    return None


def _module(args: list[str]) -> tuple[str | None, list[str]]:
    """``python [-u ...] -m MODULE rest``: the module and what follows it."""
    for index, arg in enumerate(args):
        if arg == "-m" and index + 1 < len(args):
            return args[index + 1], args[index + 2 :]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:], args[index + 1 :]
        if not arg.startswith("-"):
            return None, args
    return None, args


def _options(args: list[str], flags: set[str] | None) -> dict[str, str]:
    """``--name value`` / ``--name=value`` / ``-r 3`` before the first positional argument (the
    training script). With ``flags`` None (a launcher whose flags are not listed here) an option is
    taken to have a value when the next word does not start with "-" and is not a script."""
    found: dict[str, str] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("-") or arg == "-":
            break
        name, has_value, value = arg.lstrip("-").partition("=")
        name = _SHORT.get(name, name).replace("_", "-")
        if has_value:
            found[name] = value
        elif flags is not None and name in flags:
            found[name] = ""
        elif (
            index + 1 < len(args)
            and not args[index + 1].startswith("-")
            and (flags is not None or not args[index + 1].endswith((".py", ".sh")))
        ):
            found[name] = args[index + 1]
            index += 1
        else:
            found[name] = ""
        index += 1
    return found


def environment(launcher: Launcher, env: Mapping[str, str], *, ranks_dir: str, error_file: str) -> dict[str, str]:
    """What to add to the launcher's environment: for torchrun, a log folder of the attempt's own
    and the tee that keeps the console output (unless the command line or the environment chose
    them), and the agent's error file."""
    if launcher.kind != "torchrun":
        return {}
    added = {}
    if launcher.option("log-dir", env) is None:
        added["PET_LOG_DIR"] = ranks_dir
    if launcher.option("tee", env) is None and launcher.option("redirects", env) is None:
        added["PET_TEE"] = "3"  # stdout and stderr of every rank: into its files and the console
    if not env.get("TORCHELASTIC_ERROR_FILE"):
        added["TORCHELASTIC_ERROR_FILE"] = error_file
    return added


def log_dirs(launcher: Launcher, env: Mapping[str, str]) -> list[str]:
    """The folders where the launcher puts its ranks' files (after ``environment`` was applied)."""
    if launcher.kind == "torchrun":
        folder = launcher.option("log-dir", env)
    elif launcher.kind == "deepspeed":
        folder = launcher.option("enable-each-rank-log")
    else:
        folder = launcher.option("log-dir")
    return [folder] if folder and folder != "None" else []


# ---------------------------------------------------------------------------------------------- disk
@dataclass(frozen=True)
class RankFile:
    path: str
    local_rank: int
    kind: str  # stdout | stderr | error | log


def rank_files(folders: Sequence[str], *, since: float = 0.0, max_depth: int = 4) -> list[RankFile]:
    """Every rank's files below the folders, written since ``since``: torchrun's
    ``attempt_<k>/<local rank>/{stdout.log, stderr.log, error.json}`` (of its newest restart ``k``,
    the one that ended the attempt) and DeepSpeed's ``*_rank<N>.log``."""
    found: list[RankFile] = []
    for folder in folders:
        torch_attempts: dict[str, list[RankFile]] = {}
        for root, _dirs, files in _walk(folder, max_depth):
            parent = os.path.basename(os.path.dirname(root))
            here = os.path.basename(root)
            if _TORCH_ATTEMPT.match(parent) and here.isdigit():
                for name, kind in (("stdout.log", "stdout"), ("stderr.log", "stderr"), ("error.json", "error")):
                    path = os.path.join(root, name)
                    if name in files and _newer(path, since):
                        torch_attempts.setdefault(os.path.dirname(root), []).append(RankFile(path, int(here), kind))
            for name in files:
                if match := _EACH_RANK_LOG.search(name):
                    path = os.path.join(root, name)
                    if _newer(path, since):
                        found.append(RankFile(path, int(match.group(1)), "log"))
        if torch_attempts:
            newest = max(torch_attempts, key=lambda a: (int(_TORCH_ATTEMPT.match(os.path.basename(a)).group(1)),
                                                         os.path.getmtime(a)))  # fmt: skip
            found += sorted(torch_attempts[newest], key=lambda f: (f.local_rank, f.kind))
    return found


def _walk(folder: str, max_depth: int):
    base = folder.rstrip(os.sep).count(os.sep)
    for root, dirs, files in os.walk(folder):
        if root.count(os.sep) - base >= max_depth:
            dirs[:] = []
        yield root, dirs, files


def _newer(path: str, since: float) -> bool:
    try:
        return os.path.getmtime(path) >= since - 1.0
    except OSError:
        return False


def torch_error_text(path: str) -> str | None:
    """A torchelastic error file (``@record``, the agent's copy of the first failure) as the lines a
    person would read: the exception, then its traceback."""
    payload = untrusted.load_object(path, untrusted.MAX_ERROR_FILE_BYTES)
    message = payload.get("message") if payload is not None else None
    if isinstance(message, str):
        return message + "\n"
    if not isinstance(message, dict):
        if payload is not None:
            untrusted.warn_once(path, "no message")
        return None
    info = message.get("extraInfo")
    stack = info.get("py_callstack") if isinstance(info, dict) else None
    return f"{message.get('message', '')}\n{stack if isinstance(stack, str) else ''}"


def worker_identity(pid: int) -> tuple[int, int] | None:
    """(global rank, local rank) of a launcher's worker, from its environment; None for anything else."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    try:
        return int(env[b"RANK"]), int(env[b"LOCAL_RANK"])
    except (KeyError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------- record
def record_path(run_dir: str, n: int) -> str:
    return os.path.join(run_dir, f"attempt-{n}.launch.json")


def write_record(path: str, record: Mapping[str, Any]) -> None:
    """What the supervisor knows of an attempt's ranks, for the diagnosis then and later
    (`trainguard diagnose RUN`). Best effort: a full state disk loses it, not the supervision."""
    with contextlib.suppress(OSError), open_private(Path(path)) as out:
        json.dump(record, out)


def read_record(path: str) -> dict[str, Any] | None:
    return untrusted.load_object(path)
