"""Markdown cells and tables for every bench's report.md ("—" where a figure is missing)."""


def number_cell(value, digits: int = 1, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def percent_cell(value) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def speedup_cell(value) -> str:
    return "—" if value is None else f"{value:.2f}x"


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]
