"""Reading the systems' per-client CSV files (availability and speed traces) with one-line errors
that name the config key, the file and the line."""
from __future__ import annotations

import math
import pathlib
from typing import Iterator

from rayfed.errors import ConfigError


def read_rows(path: str | pathlib.Path, key: str, header: str, rows_hold: str) -> Iterator[tuple[str, list[str]]]:
    """(where, fields) for every non-blank line after the header; `where` names key, file and line.
    `rows_hold` says what a row is (intervals, clients), for the message about a file without rows."""
    path = pathlib.Path(path)
    try:
        # utf-8-sig: spreadsheet exports often begin with a byte-order mark.
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{key}={path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{key}={path} cannot be read as a text file ({error})") from None
    where = f"{key}={path}"
    if not lines:
        raise ConfigError(f"{where} line 1: the file is empty; it must begin with the header {header}")
    if lines[0].strip() != header:
        raise ConfigError(f"{where} line 1: the header is {lines[0]!r}; it must be exactly {header}")
    columns = header.count(",") + 1
    rows = 0
    for line_number, line in enumerate(lines[1:], start=2):
        # Blank lines (left at the end by editors, or between files joined with cat) hold no row.
        if not line.strip():
            continue
        fields = line.split(",")
        if len(fields) != columns:
            raise ConfigError(f"{where} line {line_number}: {len(fields)} fields, expected {columns} ({header})")
        rows += 1
        yield f"{where} line {line_number}", fields
    if not rows:
        raise ConfigError(f"{where} line 2: no {rows_hold} after the header; list at least one {header} line")


def parse_client_id(text: str, num_clients: int, where: str) -> int:
    try:
        client_id = int(text)
    except ValueError:
        raise ConfigError(f"{where}: client_id {text.strip()!r} is not a whole number") from None
    if client_id < 0:
        raise ConfigError(f"{where}: client_id {client_id} is negative; ids run from 0 to {num_clients - 1}")
    if client_id >= num_clients:
        raise ConfigError(f"{where}: client_id {client_id} exceeds data.num_clients={num_clients}; "
                          f"ids run from 0 to {num_clients - 1}")
    return client_id


def parse_number(text: str, column: str, unit: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{where}: {column} {text.strip()!r} is not a number of {unit}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {column} {text.strip()!r} is not a finite number of {unit}")
    return value
