"""The report wing: what the ranks' recordings say about running on Trainium.

``merge`` turns the ranks' recordings into the report's data (``desync`` compares their
collectives), ``verdict`` judges it (fit, the verdict's problems, which chips to estimate, through
the estimate wing), ``render`` lays it out in sections, ``formats`` writes those as the terminal
summary, Markdown and HTML, ``plots`` draws the pictures; ``report.Report`` holds it all.

May import: the record wing's recording types, the estimate wing, ``_torch_private`` never (a
report reads recordings only: it runs without the script and without torch's private parts).
"""

from .report import Report

__all__ = ["Report"]
