"""The anatomy as one self-contained HTML page: `inspect_page(report)` for `anatomy inspect --html`,
`compare_page(reports)` for `anatomy compare --html`, `attention_page(maps)` for
`anatomy attention --html`. Styles, scripts and data are inlined; nothing is fetched at view time."""

from anatomy.analysis.page.build import check_output_path, inspect_page, notebook_frame, write_page
from anatomy.analysis.page.compare import compare_page

__all__ = ["inspect_page", "compare_page", "write_page", "check_output_path", "notebook_frame"]
