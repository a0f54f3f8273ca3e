"""Reports from run directories: tables, figures, one self-contained HTML (no torch)."""

from klppo.report.build import Report, final_returns, format_table, make_report

__all__ = ["Report", "final_returns", "format_table", "make_report"]
