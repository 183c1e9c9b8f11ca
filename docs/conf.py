"""Sphinx configuration of the Parallax docs (built by docs/build; see docs/README.md)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))  # the parallax package, as it is
sys.path.insert(0, os.path.join(HERE, "_ext"))

project = "Parallax"
author = "the Parallax authors"
copyright = "the Parallax authors"

extensions = [
    "myst_parser",            # pages in Markdown
    "breathe",                # the C API reference, from Doxygen's XML of parallax_c.h
    "sphinx.ext.autodoc",     # the Python API reference, from the docstrings
    "sphinx.ext.graphviz",    # architecture.dot, rendered by `dot` at build time
    "pxcoverage",             # every public Python name documented, or a warning (-W: an error)
    "pxplots",                # the benchmark plots (docs/_tools/plot_bench.py), as figures
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "_tools", "_ext", "bench/*.json"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3      # [text](page.md#a-heading) links to headings, checked by -n

# Doxygen's XML: docs/build runs doxygen first and passes where it wrote it.
breathe_projects = {"parallax": os.environ.get("PX_DOXYGEN_XML", os.path.join(HERE, "_build", "doxygen", "xml"))}
breathe_default_project = "parallax"
breathe_domain_by_extension = {"h": "c"}
breathe_show_define_initializer = True
breathe_show_enumvalue_initializer = True

# `import parallax` loads libparallax.so.1 (clients/python/parallax/_lib.py): the reference
# is built from the package without the library, its ctypes layer stood in for by a mock.
# The docstrings are all in the other modules; nothing is run.
autodoc_mock_imports = ["parallax._lib"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

nitpicky = True
# Types named in signatures that no page of this site documents (NumPy's, PyTorch's,
# the standard library's through typing): an intersphinx mapping would need the network.
nitpick_ignore_regex = [
    ("py:.*", r"(np|numpy|torch|typing|collections|ctypes|asyncio|weakref|os)(\..*)?"),
    ("py:.*", r"(Any|Optional|Union|List|Dict|Tuple|Sequence|Iterable|Iterator|Callable|Mapping)"),
    ("py:.*", r"(int|float|str|bool|bytes|list|dict|tuple|object|None|type|Exception|.*Error)"),
    ("py:.*", r"parallax\._lib.*|_lib\..*"),
    ("c:.*", r"(uint32_t|int32_t|uint64_t|int64_t|size_t)"),
    ("py:class", r"Shape|Module|parallax\..*\._\w+"),   # type aliases; private base classes
]

# Public names of clients/python whose docstrings are missing today (pxcoverage warns for
# every other one). Each goes from this list once its docstring is written; a name listed
# here that is documented is reported (not an error: whoever writes the docstring need not
# touch the docs), to be taken off the list.
pxcoverage_known_missing = [
    "parallax.Client.describe",
    "parallax.Client.rank",
    "parallax.Client.world_size",
    "parallax.Client.local_rank",
    "parallax.Request.what",
]

html_theme = "sphinx_rtd_theme"   # not Debian's furo: its furo.js fails to load (README.md)
html_title = "Parallax"
html_static_path = []
graphviz_output_format = "svg"


def _module_docstring_as_text(app, what, name, obj, options, lines):
    """The package's module docstrings are plain text with indented examples, not
    reStructuredText: shown as they are written."""
    if what == "module" and lines:
        lines[:] = ["::", ""] + ["   " + line for line in lines] + [""]


def _doxygen_self_reference(app, env, node, contnode):
    """Doxygen links a macro's initializer (PX_ABI_VERSION_MAJOR in PX_ABI_VERSION) and the
    header's own name to targets breathe does not label: left as text."""
    if node.get("reftype") == "ref" and node.get("reftarget", "").startswith("parallax__c_8h"):
        return contnode
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _module_docstring_as_text)
    app.connect("missing-reference", _doxygen_self_reference)
