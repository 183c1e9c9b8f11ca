#!/usr/bin/python3
"""The docs site, tested as a reader gets it (ctest docs/site; issue 34).

1. docs/build OUT: Doxygen, then Sphinx with -W -n (warnings, broken links and references,
   an undocumented public C or Python name: errors).
2. The README's picture, docs/architecture.png, is what `dot` renders from
   docs/architecture.dot today (docs/_tools/render_architecture).
3. Every page of the built site is opened from disk by headless Chromium, in one browser
   run: a harness page holds each page in an iframe and records its load event. A page
   that does not load, or any console message (an error, an uncaught exception, a
   console.log left behind), fails. Chromium does not put failed resource loads on the
   console, so every local src/href of every page must also exist on disk.
4. Screenshots of the front page and the Python API page, kept in OUT/screenshots, must
   not be blank (Pillow: enough pixels away from the background colour).
5. Every benchmark plot docs/_tools/plot_bench.py drew (its manifest.json) is in the built
   site's _images, shown by the page the manifest names, and not blank (the same measure).

Usage: check_site.py SOURCE_DIR OUT_DIR
"""
import collections
import html.parser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import urllib.parse

CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", "--hide-scrollbars", "--allow-file-access-from-files"]


def step(what):
    print(f"docs: {what}", flush=True)


def fail(message):
    print(f"docs: FAIL: {message}", flush=True)
    sys.exit(1)


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.refs.append(value)


def local_refs_missing(page: pathlib.Path):
    parser = Links()
    parser.feed(page.read_text(encoding="utf-8"))
    missing = []
    for ref in parser.refs:
        parsed = urllib.parse.urlparse(ref)
        if parsed.scheme or ref.startswith("//") or ref.startswith("#"):
            continue
        path = urllib.parse.unquote(parsed.path)
        if not path:
            continue
        target = (page.parent / path).resolve()
        if not target.exists():
            missing.append(ref)
    return missing


PROFILE = None   # a profile of the test's own, in its output folder (parallel runs, no $HOME)


def chromium(args, timeout=90):
    return subprocess.run(CHROMIUM + [f"--user-data-dir={PROFILE}"] + args,
                          capture_output=True, text=True, timeout=timeout)


TOOLS = {"doxygen": "doxygen", "dot": "graphviz", "chromium": "chromium"}
MODULES = {"sphinx": "python3-sphinx", "breathe": "python3-breathe",
           "myst_parser": "python3-myst-parser", "sphinx_rtd_theme": "python3-sphinx-rtd-theme",
           "PIL": "python3-pil", "torch": "python3-torch", "matplotlib": "python3-matplotlib"}


def check_tools():
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    for module, pkg in MODULES.items():
        try:
            __import__(module)
        except ImportError:
            missing.append(pkg)
    if missing:
        fail("missing Debian packages (tools/quickstart installs them): " + " ".join(missing))


def check_pages(html_dir: pathlib.Path, out: pathlib.Path):
    pages = sorted(p for p in html_dir.rglob("*.html")
                   if "_static" not in p.parts and "_sources" not in p.parts)
    if len(pages) < 10:
        fail(f"only {len(pages)} pages built in {html_dir}")
    for page in pages:
        missing = local_refs_missing(page)
        if missing:
            fail(f"{page.relative_to(html_dir)} links to files that are not there: {missing}")
    frames = "\n".join(
        f'<iframe id="f{i}" src="{p.as_uri()}" width="1000" height="300" '
        f'onload="this.setAttribute(\'data-loaded\', \'yes\')"></iframe>'
        for i, p in enumerate(pages))
    harness = out / "all-pages.html"
    harness.write_text(f"<!DOCTYPE html><html><body>{frames}</body></html>", encoding="utf-8")
    r = chromium(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000",
                  "--dump-dom", harness.as_uri()], timeout=180)
    (out / "chromium-pages.log").write_text(r.stderr, encoding="utf-8")
    if r.returncode != 0:
        fail(f"chromium exited {r.returncode} on the pages (chromium-pages.log)")
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    if console:
        fail("console messages:\n  " + "\n  ".join(console))
    loaded = set(re.findall(r'<iframe id="f(\d+)"[^>]*data-loaded="yes"', r.stdout))
    not_loaded = [str(p.relative_to(html_dir)) for i, p in enumerate(pages)
                  if str(i) not in loaded]
    if not_loaded:
        fail(f"pages that did not load: {not_loaded}")
    return pages


def screenshot(page: pathlib.Path, png: pathlib.Path):
    r = chromium(["--window-size=1280,1000", f"--screenshot={png}", page.as_uri()])
    if r.returncode != 0 or not png.exists():
        fail(f"no screenshot of {page}: {r.stderr[-2000:]}")
    from PIL import Image
    with Image.open(png) as im:
        im = im.convert("RGB")
        w, h = im.size
        # The page's text column (right of the theme's 300-pixel navigation bar), whose
        # ink must come from the page's content, not from the theme's chrome.
        content = im.crop((320, 0, w, h))
        small = content.resize((content.width // 4, content.height // 4))
        pixels = list(small.getdata())
    share, colours = ink(pixels)
    if share < 0.02 or colours < 16:
        fail(f"{png.name} looks blank: {share:.2%} of the text column's pixels away from "
             f"its background, {colours} colours")
    return {"file": str(png), "size": [w, h], "ink": round(share, 4), "colours": colours}


def ink(pixels):
    """The share of pixels away from the commonest colour (the background), and how many
    colours there are."""
    counts = collections.Counter(pixels)
    background = counts.most_common(1)[0][0]
    away = sum(n for p, n in counts.items() if sum(abs(a - b) for a, b in zip(p, background)) > 60)
    return away / len(pixels), len(counts)


def check_plots(site: pathlib.Path, html_dir: pathlib.Path):
    from PIL import Image
    manifest = json.loads((site / "plots" / "manifest.json").read_text(encoding="utf-8"))
    if not manifest:
        fail("docs/_tools/plot_bench.py drew no plot")
    results = []
    for plot in manifest:
        png = html_dir / "_images" / f"{plot['name']}.png"
        page = html_dir / f"{plot['page']}.html"
        if not png.exists():
            fail(f"plot {plot['name']} is not in the built site ({png})")
        if f"_images/{png.name}" not in page.read_text(encoding="utf-8"):
            fail(f"plot {plot['name']} is not shown on {page.relative_to(html_dir)}")
        with Image.open(png) as im:
            im = im.convert("RGB")
            small = im.resize((im.width // 2, im.height // 2))
            share, colours = ink(list(small.getdata()))
        if share < 0.02 or colours < 16:
            fail(f"plot {png.name} looks blank: {share:.2%} of its pixels away from its "
                 f"background, {colours} colours")
        results.append({"plot": plot["name"], "page": plot["page"], "ink": round(share, 4),
                        "colours": colours})
    return results


def png_is_current(src: pathlib.Path, out: pathlib.Path):
    script = src / "docs" / "_tools" / "render_architecture"
    fresh = out / "architecture.png"
    subprocess.run([str(script), str(fresh)], check=True)
    committed = src / "docs" / "architecture.png"
    if fresh.read_bytes() != committed.read_bytes():
        fail("docs/architecture.png is not what docs/architecture.dot renders today: "
             "run docs/_tools/render_architecture and commit the PNG")


def main():
    global PROFILE
    src, out = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
    t0 = time.monotonic()
    check_tools()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    PROFILE = out / "chromium-profile"
    step("building the site (doxygen, sphinx-build -W -n)")
    subprocess.run([str(src / "docs" / "build"), str(out / "site")], check=True)
    html_dir = out / "site" / "html"
    t_build = time.monotonic() - t0
    step("checking docs/architecture.png against docs/architecture.dot")
    png_is_current(src, out)
    step("opening every page in headless chromium")
    pages = check_pages(html_dir, out)
    t_pages = time.monotonic() - t0 - t_build
    step("screenshots")
    shots = out / "screenshots"
    shots.mkdir()
    results = [screenshot(html_dir / "index.html", shots / "front-page.png"),
               screenshot(html_dir / "python-api.html", shots / "python-api.png")]
    step("benchmark plots")
    plots = check_plots(out / "site", html_dir)
    summary = {"pages": len(pages), "screenshots": results, "plots": plots,
               "seconds": {"build": round(t_build, 1), "pages": round(t_pages, 1),
                           "total": round(time.monotonic() - t0, 1)}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    step(f"ok: {len(pages)} pages, {len(plots)} plots, screenshots in {shots}, "
         f"{summary['seconds']['total']} s ({summary['seconds']})")


if __name__ == "__main__":
    main()
