"""Regexes for JSON Schema string formats (the part between the quotes).

Runs in compile workers. outlines-core ships format regexes, but some admit values that are not
valid for the format (2023-02-31, a date-time without offset) or not even valid JSON strings (its
uri and email regexes allow `"`, `\\` and control characters), so json_schema.py uses these.
"""

from __future__ import annotations

_D31 = r"(?:0[1-9]|[12][0-9]|3[01])"
_D30 = r"(?:0[1-9]|[12][0-9]|30)"
_D28 = r"(?:0[1-9]|1[0-9]|2[0-8])"
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
DATE = (rf"(?:[0-9]{{4}}-(?:(?:0[13578]|1[02])-{_D31}|(?:0[469]|11)-{_D30}|02-{_D28})"
        rf"|{_LEAP_YEAR}-02-29)")
_PARTIAL_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
_OFFSET = r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
TIME = _PARTIAL_TIME + _OFFSET
DATE_TIME = DATE + "T" + TIME
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
EMAIL = r"[a-zA-Z0-9_%+-]+(?:\.[a-zA-Z0-9_%+-]+)*@(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)+[a-zA-Z]{2,24}"
# RFC 3986 characters only (no quote, backslash, space or control characters).
_PCHAR = r"[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2}"
URI = (r"(?:https?|ftp)://(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,24}(?::[1-9][0-9]{0,4})?"
       rf"(?:/(?:{_PCHAR})*)*(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?")

FORMAT_REGEXES: dict[str, str] = {"date": DATE, "time": TIME, "date-time": DATE_TIME, "uuid": UUID,
                                  "email": EMAIL, "uri": URI}
