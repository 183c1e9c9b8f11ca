#!/usr/bin/python3
"""Doxygen INPUT_FILTER for include/parallax_c.h: its comments are plain C comments
(the header stays readable as C99 and keeps one style), read here as Doxygen's.

* the first comment of the file is the file's description;
* a section divider, "/* --- title --- ... */", with text under its rule becomes a
  paragraph of the file's description (the text explains a whole section, not the
  declaration under it); without text it is left a plain comment;
* a comment after code on the same line documents that code ("/**<");
* any other comment documents the declaration that follows it ("/**").

Line numbers are kept (comments only change their opening characters), so Doxygen's
warnings point at the header's real lines. Usage: doxygen_filter.py FILE (stdout).
"""
import re
import sys

COMMENT = re.compile(r"/\*.*?\*/", re.S)


def convert(text: str) -> str:
    out = []
    pos = 0
    first = True
    for m in COMMENT.finditer(text):
        body = m.group(0)
        out.append(text[pos:m.start()])
        pos = m.end()
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[line_start:m.start()]
        # "<path>/<job>" is text, not an HTML tag, to Doxygen once escaped
        inner = body[2:-2].replace("<", "\\<").replace(">", "\\>")
        if body.startswith("/**") or body.startswith("/*!"):
            out.append(body)                       # already Doxygen's
        elif first and not before.strip():
            out.append("/** @file" + inner + "*/")
        elif inner.lstrip().startswith("---"):
            head, _, rest = inner.partition("\n")
            title = head.strip().strip("-").strip()
            if rest.strip():
                out.append("/** @par " + title + "\n" + rest + " @file */")
            else:
                out.append(body)
        elif before.strip():
            out.append("/**<" + inner + "*/")
        else:
            out.append("/**" + inner + "*/")
        first = False
    out.append(text[pos:])
    return "".join(out)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(convert(f.read()))
