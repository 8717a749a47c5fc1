"""How the project's own scripts (tools/, benchmarks/) end: a missing file, a missing folder or
argument, a missing dependency is one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable


class ScriptError(Exception):
    """What a script says when it cannot do its work (for example: no GPU on this machine)."""


def run_script(main: Callable[[], int | None]) -> None:
    name = os.path.basename(sys.argv[0])
    try:
        code = main()
    except ScriptError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"{name}: {exc.strerror or exc}{where}", file=sys.stderr)
        sys.exit(2)
    except ImportError as exc:
        print(f"{name}: {exc.name or exc} is not installed ({exc})", file=sys.stderr)
        sys.exit(2)
    except subprocess.CalledProcessError as exc:
        print(f"{name}: {' '.join(map(str, exc.cmd))} failed with exit status {exc.returncode}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
