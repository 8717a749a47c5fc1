"""trainguard's start-up hook for the Python processes of a supervised job. This folder is not a
package: `trainguard run` puts it first on the job's PYTHONPATH, so every Python process of the job
(the main one, a launcher's ranks, spawned and forked DataLoader workers) runs this as it starts.

It arms faulthandler on a signal of trainguard's own (its number in TRAINGUARD_STACKS_SIGNAL): on
that signal the process writes every thread's Python stack into its own file, <pid>.txt in the
folder TRAINGUARD_STACKS_DIR names. A hang dump then needs neither py-spy nor ptrace rights. Then the
user's own sitecustomize, if one is further along sys.path, runs as it would have without trainguard.

Every error of its own is swallowed: the hook never fails a job. It imports nothing but faulthandler
(built in; already loaded under PYTHONFAULTHANDLER=1) and os and sys (loaded before site runs): the
`signal` module alone would cost milliseconds in every process. It stays Python 3.6 syntax: the job's
Python need not be trainguard's.
"""

import os
import sys


def _arm_stack_dumps():
    folder = os.environ.get("TRAINGUARD_STACKS_DIR")
    signum = int(os.environ.get("TRAINGUARD_STACKS_SIGNAL") or 0)
    if not folder or signum <= 0:
        return
    import faulthandler

    own = {"fd": None}

    def write_own_file():
        """Registered again in a forked child: it writes a file of its own, not its parent's."""
        try:
            os.makedirs(folder, 0o700, exist_ok=True)  # the first Python process of the attempt makes it
            path = os.path.join(folder, f"{os.getpid()}.txt")
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(path, flags, 0o600)
        except Exception:
            fd = None
        try:
            if fd is None:
                faulthandler.unregister(signum)  # a forked child that cannot have its own file stays silent
            else:
                # No chain: faulthandler would re-raise the signal under the previous action, which for
                # a real-time signal is to terminate; nothing can have handled it before this hook.
                faulthandler.register(signum, file=fd, all_threads=True, chain=False)
        except Exception:
            pass
        if own["fd"] is not None:
            try:  # noqa: SIM105 - contextlib is not loaded at start: importing it would cost every process
                os.close(own["fd"])
            except OSError:
                pass
        own["fd"] = fd

    write_own_file()
    register_at_fork = getattr(os, "register_at_fork", None)
    if register_at_fork is not None:
        register_at_fork(after_in_child=write_own_file)


def _run_the_users_sitecustomize():
    """The user's own sitecustomize, found as Python would have found it without this folder first."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    this = sys.modules.pop(__name__, None)
    try:
        import sitecustomize  # noqa: F401 - the user's, further along sys.path
    except ImportError as exc:
        if getattr(exc, "name", None) != "sitecustomize":
            raise  # the user's hook failed: site reports it as it would have without trainguard
        if this is not None:
            sys.modules[__name__] = this  # none of their own: the import of this one completes


try:  # noqa: SIM105 - see above
    _arm_stack_dumps()
except Exception:
    pass
_run_the_users_sitecustomize()
