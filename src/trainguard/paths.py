"""Where trainguard keeps things on disk (DESIGN section 3), and whether it may trust them.

The state folder holds the commands trainguard runs as you (``restart`` runs what the registry
says): a folder, registry or run folder that another user owns or may write is refused, never used,
as OpenSSH's StrictModes and tmux's socket folder check do. Every folder above it must be owned by
you or root and writable by nobody else, or carry the sticky bit (``/tmp``), so that nobody can
rename a folder of yours away and put their own in its place."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

from trainguard.errors import UsageError


class UntrustedPath(UsageError):
    """A path of the state that another user could change."""


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$TRAINGUARD_HOME, else $XDG_STATE_HOME/trainguard, else ~/.local/state/trainguard."""
    env = os.environ if environ is None else environ
    if env.get("TRAINGUARD_HOME"):
        return Path(env["TRAINGUARD_HOME"])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "trainguard"
    return Path.home() / ".local" / "state" / "trainguard"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Derived data that can be rebuilt at any time: $XDG_CACHE_HOME/trainguard or ~/.cache/trainguard."""
    env = os.environ if environ is None else environ
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "trainguard"
    return Path.home() / ".cache" / "trainguard"


def open_private(path: str | os.PathLike[str], mode: str = "w"):
    """Open a file in the state folder for writing, created 0600 (it may hold a run's secrets)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _own_group(gid: int) -> bool:
    """A user private group (umask 002 systems make ~/.local 0775): named after the user, no one else in it."""
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == me and set(group.gr_mem) <= {me}


def _refuse(path: Path, why_en: str, why_zh: str) -> UntrustedPath:
    return UntrustedPath(
        f"refusing {path} of the state folder: {why_en}, so another user could run commands as you through it;"
        " use a folder only you can write (unset TRAINGUARD_HOME, or point it at one of your own)",
        f"拒绝使用状态目录中的 {path}：{why_zh}，其他用户可借此以你的身份运行命令；"
        "请使用只有你能写入的目录（取消 TRAINGUARD_HOME，或指向你自己的目录）",
    )


def check_trusted(path: Path, *, within: Path | None = None) -> None:
    """Raise :class:`UntrustedPath` unless ``path`` (when it exists) and every folder above it can
    be changed by nobody but you (and root). ``within``: the folder ``path`` must resolve inside
    (a run folder reached through a symlink that points out of the state folder is refused)."""
    me = os.geteuid()
    real = Path(os.path.realpath(path))
    if within is not None and not real.is_relative_to(os.path.realpath(within)):
        raise _refuse(path, f"it leads outside {within}", f"它指向 {within} 之外")
    try:
        info = os.stat(real)
    except FileNotFoundError:
        info = None
    if info is not None and info.st_uid != me:
        raise _refuse(path, f"it belongs to {_owner(info.st_uid)}, not to you",
                      f"它属于 {_owner(info.st_uid)}，而不是你")  # fmt: skip
    for folder in real.parents:
        try:
            above = os.stat(folder)
        except OSError:
            continue
        if above.st_uid not in (0, me):
            raise _refuse(path, f"the folder above it, {folder}, belongs to {_owner(above.st_uid)}",
                          f"其上级目录 {folder} 属于 {_owner(above.st_uid)}")  # fmt: skip
        others_write = above.st_mode & stat.S_IWOTH or (above.st_mode & stat.S_IWGRP and not _own_group(above.st_gid))
        if others_write and not above.st_mode & stat.S_ISVTX:
            raise _refuse(path, f"other users may write the folder above it, {folder}",
                          f"其他用户可以写入其上级目录 {folder}")  # fmt: skip
