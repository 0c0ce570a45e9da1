"""Plan every run of a study before the first one trains (scripts/study.sh), every scheme in one process.

Each scheme's seeds are planned as the sweep ``train.py --check -m pe=SCHEME train.seed=SEEDS ARGS...`` plans them,
in this one process: a process imports torch and composes the config, seconds a scheme.

    python scripts/study_check.py SEEDS SCHEME... -- ARGS...

prints one line per scheme, ``<scheme> accepted`` or ``<scheme> refused <the refusal's line>``: a scheme whose first
seed train.py refuses with these settings is one the study skips. A refusal of a later seed (a value that only
that seed makes invalid) is the study's mistake, not the scheme's: it stops here, that one line and exit 2, before
any line is printed. A mistake of the command itself (an unknown config group) stops it too, in its one line.
"""

from __future__ import annotations

import _repo  # noqa: F401  (the repository's packages on sys.path)
from core.interrupts import unwind_on_sigterm

import re
import sys

from core.cli import exit_on_user_error
from core.errors import PosGPTError
from experiment.compose import check_group_choices, hydra_errors_as_user_errors
from train import check_only

LATER_SEED = re.compile(r"job [1-9][0-9]* of the sweep")  # experiment/plan.py's plan_each names a refused job so
USAGE = "usage: study_check.py SEEDS SCHEME... -- ARGS..."


def verdict(scheme: str, seeds: str, args: list[str]) -> str:
    """``accepted``, or ``refused <line>`` where train.py --check refuses the scheme's first seed; raises the
    refusal of a later seed."""
    argv = [*args, f"pe={scheme}", f"train.seed={seeds}", "-m"]
    try:
        check_group_choices(argv)
        check_only(argv)
    except PosGPTError as error:
        if LATER_SEED.match(str(error)):
            raise
        return f"refused {error}"
    return "accepted"


@exit_on_user_error
def main(argv: list[str]) -> None:
    if "--" not in argv or argv.index("--") < 2:
        raise PosGPTError(USAGE)
    split = argv.index("--")
    seeds, schemes, args = argv[0], argv[1:split], argv[split + 1 :]
    with hydra_errors_as_user_errors():
        verdicts = [f"{scheme} {verdict(scheme, seeds, args)}" for scheme in schemes]
    print("\n".join(verdicts))


if __name__ == "__main__":
    unwind_on_sigterm()
    main(sys.argv[1:])
