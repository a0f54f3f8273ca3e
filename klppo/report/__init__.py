"""Reports from run directories: tables, figures, one self-contained HTML (no torch)."""

from klppo.report.build import Report, format_table, make_report

__all__ = ["Report", "format_table", "make_report"]
