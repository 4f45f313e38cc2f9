"""Scalar types shared by the spec and status models, with their CRD patterns.

Durations, cron expressions and time-zone names are strings in the resource
(that is what people write in YAML), validated at admission by a pattern in
the CRD and parsed here, once, for everyone who needs the number.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import Field

#: Go-style durations as Kubernetes users write them: "30s", "5m", "1h30m", "250ms". Six digits a number at most
#: (999999h is 114 years): a longer one overflows the apiserver's CEL durations (int64 nanoseconds, 2562047h) and,
#: added to a date, Python's.
DURATION_PATTERN = r"^([0-9]{1,6}(\.[0-9]{1,9})?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

#: A five-field cron expression (minute hour day-of-month month day-of-week), the
#: convention of KEDA's cron scaler. Admission checks the shape, in the characters cron reads (``L`` for the last,
#: ``#`` for the nth weekday of the month: ``0 0 * * 2#2``); the controller parses it fully (``parse_cron``) and
#: reports what it cannot parse.
CRON_PATTERN = r"^\s*([0-9A-Za-z*,/#-]+\s+){4}[0-9A-Za-z*,/#-]+\s*$"

#: IANA time-zone names ("UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires",
#: "Etc/GMT+5"). Admission checks the shape; the controller checks the name exists.
TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$"

#: A Prometheus label name (the data model's rule).
LABEL_NAME_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"

Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32, examples=["30s", "5m", "1h30m"])]
CronExpression = Annotated[str, Field(pattern=CRON_PATTERN, max_length=128, examples=["0 22 * * *"])]
TimeZoneName = Annotated[str, Field(pattern=TIME_ZONE_PATTERN, max_length=64, examples=["UTC", "Europe/Berlin"])]
LabelName = Annotated[str, Field(pattern=LABEL_NAME_PATTERN, max_length=128)]


def duration_seconds(value: str) -> float:
    """Seconds in a Go-style duration string such as ``"1h30m"``.

    Raises ValueError naming the expected form when the string is not one.
    """
    if not re.fullmatch(DURATION_PATTERN, value):
        raise ValueError(f"invalid duration {value!r}: use a number with a unit, e.g. 30s, 5m, 1h30m")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))


def format_duration(seconds: float) -> str:
    """The shortest Go-style duration string for a whole number of seconds."""
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v]
    return "".join(parts) or "0s"


def parse_cron(expr: str) -> str:
    """The expression back if cron can run it, else ValueError saying what is wrong.

    Five fields (minute hour day-of-month month day-of-week) as Debian cron
    reads them, names (MON, JAN) and ``L`` included; the six-field form with
    seconds is refused because the CRD documents five.
    """
    if len(expr.split()) != 5:
        raise ValueError(f"invalid cron expression {expr!r}: use five fields, minute hour day-of-month month day-of-week")
    try:
        CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ValueError(f"invalid cron expression {expr!r}: {exc}") from exc
    return expr


def time_zone(name: str) -> ZoneInfo:
    """The ZoneInfo for an IANA name, or ValueError saying what to write instead."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: a folder of the database ("America")
        raise ValueError(
            f"unknown time zone {name!r}: use an IANA name such as UTC, Europe/Berlin or America/New_York"
        ) from exc


def utc_timestamp(moment: datetime) -> str:
    """RFC 3339 UTC timestamp with a 'Z', second precision: how Kubernetes writes times."""
    return moment.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
