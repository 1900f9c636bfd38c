"""Compare two junit XML reports of Composer's tests: Composer's Trainer vs dlrecipes' engine.

    python compare.py COMPOSER_XML OURS_XML EXPECTED_TXT

EXPECTED_TXT lists the tests allowed to fail with our engine only, one per line as
``test id  # reason`` (at most 15).  Exit 1 when an unlisted test fails with ours only, when
an entry has no reason, or when there are too many entries; listed tests that pass now are
reported as stale.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

MAX_ENTRIES = 15


def outcomes(path: Path) -> dict[str, str]:
    """test id -> passed / failed / skipped."""
    found = {}
    for case in ET.parse(path).iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        found[test] = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
    return found


def expected(path: Path) -> dict[str, str]:
    """test id -> reason, from ``test id  # reason`` lines (blank lines and ``#`` lines ignored)."""
    entries = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        test, _, reason = line.partition("#")
        entries[test.strip()] = reason.strip()
    return entries


def main(composer_xml: str, ours_xml: str, expected_txt: str) -> int:
    theirs, ours, allowed = outcomes(Path(composer_xml)), outcomes(Path(ours_xml)), expected(Path(expected_txt))
    passing = {t for t, o in theirs.items() if o == "passed"}
    ours_only_failing = sorted(t for t in passing if ours.get(t) != "passed")
    print(f"Composer's Trainer: {len(passing)} passed of {len(theirs)}")
    print(
        f"dlrecipes engine:   {sum(o == 'passed' for o in ours.values())} passed of {len(ours)}; "
        f"{len(ours_only_failing)} pass with Composer's Trainer only ({len(allowed)} expected)"
    )
    problems = 0
    for test in ours_only_failing:
        reason = allowed.get(test)
        print(
            f"  {'expected' if reason else 'UNEXPECTED'}: {test}"
            + (f"  # {reason}" if reason else f" ({ours.get(test, 'not run')})")
        )
        problems += not reason
    for test, reason in allowed.items():
        if not reason:
            print(f"  entry without a reason: {test}")
            problems += 1
        if test not in ours_only_failing:
            print(f"  stale entry (passes now, or not run): {test}")
    if len(allowed) > MAX_ENTRIES:
        print(f"  {len(allowed)} entries in {expected_txt}; at most {MAX_ENTRIES} are allowed")
        problems += 1
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
