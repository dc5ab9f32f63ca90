"""Sphinx configuration: MyST Markdown pages, the furo theme, and reference pages generated
from the code by ``_ext/jobguard_docs.py``.

The build needs no network: ``make docs`` runs ``sphinx -W`` offline, so links to Django's
documentation are plain URLs rather than intersphinx references.
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

project = "django-jobguard"
author = "The django-jobguard developers"
copyright = "2026, the django-jobguard developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "jobguard_docs", "jobguard_api_docs"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 3
html_theme = "furo"
html_title = "django-jobguard"
autodoc_member_order = "bysource"

# Sections other branches add pages to: their toctree globs may match nothing yet.
jobguard_optional_globs = ["runbooks/*"]
# Pages written on other branches. Links to them are plain text until the page is merged,
# then ordinary links; drop an entry once its page is on main.
jobguard_pending_pages = []
