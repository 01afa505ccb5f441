"""The wall clock of a rig host that NTP lost, for its Python processes only: `time.time`,
`time.time_ns` and `datetime`'s `now`, `utcnow`, `today` (and `date.today`) read
`MULTIHOST_CLOCK_OFFSET_S` seconds ahead (behind, if negative); the monotonic clocks, and with
them every sleep, wait and timeout, are left alone, as NTP drift leaves them.

The rig puts this directory first on PYTHONPATH of the skewed host's processes, so Python's
`site` imports it at start-up, before any other module. Without the variable it does nothing.
NOTE: not libfaketime, which under Python 3.11 failed `time.sleep` with EINVAL or hung
`threading.Event.wait`; and not a time namespace, which offsets only the monotonic clocks.
"""

import datetime as _datetime
import os
import time as _time

_OFFSET_S = float(os.environ.get("MULTIHOST_CLOCK_OFFSET_S") or 0.0)


def _install(offset_s: float) -> None:
    real_time, real_time_ns = _time.time, _time.time_ns
    offset_ns = round(offset_s * 1e9)
    real_datetime, real_date = _datetime.datetime, _datetime.date

    def time() -> float:
        return real_time() + offset_s

    def time_ns() -> int:
        return real_time_ns() + offset_ns

    class _Real(type):
        """Instances and subclasses of the real classes (made by C code: database drivers,
        `fromtimestamp`) pass isinstance and issubclass checks against the skewed ones."""

        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, cls.__bases__[0])

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, cls.__bases__[0])

    # NOTE: no instance dict (`__slots__`), so that the classes are the size of the real
    # ones: compiled modules that import `datetime.date` by name check its size.
    class date(real_date, metaclass=_Real):
        __slots__ = ()

        @classmethod
        def today(cls) -> real_date:
            return real_date.fromtimestamp(time())

    class datetime(real_datetime, metaclass=_Real):
        __slots__ = ()

        @classmethod
        def now(cls, tz: _datetime.tzinfo | None = None) -> real_datetime:
            return real_datetime.fromtimestamp(time(), tz)

        @classmethod
        def utcnow(cls) -> real_datetime:
            return real_datetime.fromtimestamp(time(), _datetime.UTC).replace(tzinfo=None)

        @classmethod
        def today(cls) -> real_datetime:
            return real_datetime.fromtimestamp(time())

    _time.time, _time.time_ns = time, time_ns
    _datetime.datetime, _datetime.date = datetime, date


if _OFFSET_S:
    _install(_OFFSET_S)
