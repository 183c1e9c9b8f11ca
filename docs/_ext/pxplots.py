"""The benchmark plots, rendered at build time and embedded as figures.

docs/build runs docs/_tools/plot_bench.py into OUT/plots before Sphinx and passes that
folder as PX_PLOTS_DIR (default: docs/_build/plots). A page embeds one with

    ```{pxplot} allreduce-bandwidth
    What it shows, in a sentence.
    ```

which is a docutils `figure` of PX_PLOTS_DIR/allreduce-bandwidth.png (Sphinx copies it into
_images like any figure), its caption the page's sentence followed by the plot's command,
commit and machine from the script's manifest.json: written once, in the script. A name
the script did not draw, or a plot no page embeds, is a warning (-W: an error).
"""
import json
import os
import re

from docutils.parsers.rst.directives.images import Figure
from docutils.statemachine import StringList
from sphinx.util import logging

logger = logging.getLogger(__name__)


_MANIFESTS = {}   # manifest.json's path -> {name: plot}, read once per process


def _manifest(env):
    path = os.path.join(env.config.pxplots_dir, "manifest.json")
    if path not in _MANIFESTS:
        try:
            with open(path, encoding="utf-8") as f:
                _MANIFESTS[path] = {p["name"]: p for p in json.load(f)}
        except OSError as e:
            logger.warning(f"pxplot: no plots ({e}); docs/build draws them with "
                           "docs/_tools/plot_bench.py")
            _MANIFESTS[path] = {}
    return _MANIFESTS[path]


class PxPlot(Figure):
    required_arguments = 1
    has_content = True

    def run(self):
        env = self.state.document.settings.env
        name = self.arguments[0]
        spec = _manifest(env).get(name)
        if spec is None:
            return [self.state.document.reporter.warning(
                f"pxplot: no plot named {name!r} (docs/_tools/plot_bench.py)", line=self.lineno)]
        png = os.path.join(env.config.pxplots_dir, name + ".png")
        docdir = os.path.dirname(env.doc2path(env.docname))
        self.arguments = [os.path.relpath(png, docdir)]
        self.options.setdefault("alt", spec["title"])
        self.options.setdefault("width", "100%")
        caption = " ".join(line.strip() for line in self.content if line.strip())
        command, source = re.fullmatch(r"(.*?)( \((?:page|JSON)\))?", spec["command"]).groups()
        provenance = (f"Command: `{command}`{source or ''}. Commit: {spec['commit']}. "
                      f"Machine: {spec['machine']}. Data: "
                      + ", ".join(f"`docs/bench/{f}`" for f in spec["data"]) + ".")
        self.content = StringList([f"{caption} {provenance}".strip()], items=[(env.docname, self.lineno)])
        if not hasattr(env, "px_plots_used"):
            env.px_plots_used = {}
        env.px_plots_used.setdefault(env.docname, set()).add(name)
        return super().run()


def _all_used(app, env):
    used = set().union(*getattr(env, "px_plots_used", {}).values())
    for name in sorted(set(_manifest(env)) - used):
        logger.warning(f"pxplot: plot {name!r} is drawn but no page embeds it")
    return []


def _purge(app, env, docname):
    getattr(env, "px_plots_used", {}).pop(docname, None)


def _merge(app, env, docnames, other):
    if not hasattr(env, "px_plots_used"):
        env.px_plots_used = {}
    for docname in docnames:
        if docname in getattr(other, "px_plots_used", {}):
            env.px_plots_used[docname] = other.px_plots_used[docname]


def setup(app):
    default = os.path.join(app.srcdir, "_build", "plots")
    app.add_config_value("pxplots_dir", os.environ.get("PX_PLOTS_DIR", default), "env")
    app.add_directive("pxplot", PxPlot)
    app.connect("env-check-consistency", _all_used)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    return {"version": "1", "parallel_read_safe": True}
