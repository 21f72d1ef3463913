"""`speedtronic ARGS` run in the test's own process, for commands refused before they do any work:
spawning each costs an interpreter and a torch import, seconds on CI's two cores.
"""

from __future__ import annotations

import subprocess
import warnings

# Warning categories Python hides by default (outside __main__): a subprocess never prints these.
HIDDEN = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_in_process(args: list[str], capfd) -> subprocess.CompletedProcess:
    """Run the CLI's main(args) here; return the exit code, stdout and stderr a subprocess would
    give. The warnings a subprocess would print are added to stderr, so a stray one still breaks a
    one-line check.
    """
    from speedtronic.cli import main

    capfd.readouterr()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        try:
            code = main(list(args))
        except SystemExit as exited:  # argparse's usage errors
            code = exited.code
    out, err = capfd.readouterr()
    for w in seen:
        if not issubclass(w.category, HIDDEN):
            err += warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
    return subprocess.CompletedProcess(["speedtronic", *args], code, out, err)
