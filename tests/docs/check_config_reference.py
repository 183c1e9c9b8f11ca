#!/usr/bin/python3
"""The configuration reference against the parser (ctest docs/config-reference; issue 34).

parallaxd's settings are parsed in daemon/front/config.cc: apply() takes every key, one
`key == "..."` branch each (its range from number(lo, hi), its values from the "is not a,
b or c" message, an array when it calls split_commas); kTables lists the TOML tables;
kFlags maps each flag to its key; parse_command_line() handles the flags that have no key
(`arg == "--..."`). This script reads those from the source (it fails if it finds too few:
a rewritten parser needs this script updated) and checks, each way:

1. the reference in docs/configuration.md (the definition lists under "## Reference":
   read_reference() says their form) has one entry per key and one per keyless flag, and
   no other; each entry names the key's flag (or none), sits under its table's heading,
   states the key's range or values as the parser has them, and the default `parallaxd
   --help` gives where it gives a number;
2. `parallaxd --help` (when the daemon is given) lists every flag the parser takes and no
   other, except those in KNOWN_MISSING_FROM_HELP (a list that only shrinks);
3. packaging/parallaxd.toml, with its commented-out `#key = value` lines taken as set,
   shows every key and only known ones, with values the parser takes, and each integer or
   enumerated value is the reference's default (the file says it shows the defaults); the
   daemon's --check-config accepts the file as it ships;
4. every ```toml block of the docs pages is a configuration the parser takes (the
   daemon's --check-config too), every `table.key` named in a code span of the docs or the
   README is a key, and every flag after `parallaxd` in them is a flag.

Usage: check_config_reference.py SOURCE_DIR [PARALLAXD]
"""
import ast
import grp
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import tomllib

REFERENCE = "docs/configuration.md"
# Flags the parser takes that `parallaxd --help` does not list: fix the usage text in
# config.cc and remove them here (the check fails while an entry here is listed).
KNOWN_MISSING_FROM_HELP = {
    "-h": "an alias of --help",
}
UINT64_MAX = 2**64 - 1

errors = []


def error(message):
    errors.append(message)


def fail_now(message):
    print(f"config-reference: FAIL: {message}", flush=True)
    sys.exit(1)


# --- the parser ---------------------------------------------------------------------------

def int_expression(text, constants):
    """Evaluates a C++ integer expression of the parser's ranges: 1 << 20, 1ull << 30,
    UINT64_MAX, kMaxNodeIndex."""
    text = re.sub(r"\b(\d+)(?:ull|ul|ll|u|l)\b", r"\1", text.strip(), flags=re.I)
    for name, value in constants.items():
        text = re.sub(rf"\b{name}\b", str(value), text)
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp):
            ops = {ast.LShift: lambda a, b: a << b, ast.Add: lambda a, b: a + b,
                   ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
            if type(node.op) in ops:
                return ops[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"cannot evaluate '{text}'")
    return ev(ast.parse(text, mode="eval"))


def function_body(source, signature):
    """The text of the function whose definition starts with signature, braces matched."""
    start = source.find(signature)
    if start < 0:
        fail_now(f"config.cc has no '{signature}': update this script to the parser")
    open_brace = source.index("{", start)
    depth = 0
    for i in range(open_brace, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[open_brace:i + 1]
    fail_now(f"unbalanced braces after '{signature}'")


def read_parser(src):
    config_cc = (src / "daemon/front/config.cc").read_text()
    cluster_h = (src / "daemon/cluster/cluster_config.h").read_text()
    constants = {"UINT64_MAX": UINT64_MAX, "UINT32_MAX": 2**32 - 1}
    m = re.search(r"kMaxNodeIndex\s*=\s*(\d+)", cluster_h)
    if m:
        constants["kMaxNodeIndex"] = int(m.group(1))

    keys = {}  # key -> {"range": (lo, hi) | None, "values": [...] | None, "array": bool}
    apply_body = function_body(config_cc, "bool apply(DaemonConfig*")
    branches = list(re.finditer(r'key == "([a-z_.]+)"', apply_body))
    for i, m in enumerate(branches):
        end = branches[i + 1].start() if i + 1 < len(branches) else len(apply_body)
        text = apply_body[m.end():end]
        info = {"range": None, "values": None, "array": "split_commas" in text}
        n = re.search(r"number\(([^,]+),\s*([^)]+)\)", text)
        if n:
            info["range"] = (int_expression(n.group(1), constants),
                             int_expression(n.group(2), constants))
        v = re.search(r"is not ([a-z-]+(?:, [a-z-]+)* or [a-z-]+)[\"']", text)
        if v:
            info["values"] = re.split(r", | or ", v.group(1))
        keys[m.group(1)] = info

    t = re.search(r"kTables\s*=\s*\{([^}]*)\}", config_cc)
    tables = set(re.findall(r'"([a-z_]+)"', t.group(1))) if t else set()
    parse = function_body(config_cc, "DaemonConfig parse_command_line(")
    flags = dict(re.findall(r'\{"(--[a-z-]+)",\s*"([a-z_.]+)"\}', parse))
    keyless = set(re.findall(r'arg == "(--?[a-z-]+)"', parse)) - set(flags)

    if len(keys) < 30 or len(flags) < 30 or not tables or not keyless:
        fail_now(f"found only {len(keys)} keys, {len(flags)} flags, {len(tables)} tables and "
                 f"{len(keyless)} keyless flags in daemon/front/config.cc: the parser changed "
                 "shape, update this script")
    for key in keys:
        if "." in key and key.split(".")[0] not in tables:
            error(f"config.cc: key {key}'s table is not in kTables")
    for table in tables:
        if not any(k.startswith(table + ".") for k in keys):
            error(f"config.cc: table [{table}] in kTables has no key in apply()")
    for flag, key in flags.items():
        if key not in keys:
            error(f"config.cc: kFlags maps {flag} to '{key}', which apply() does not take")
    return keys, tables, flags, keyless


# --- the reference ------------------------------------------------------------------------

def code_spans(cell):
    return re.findall(r"`([^`]*)`", cell)


def expected_values(info):
    """What the values cell must say for a key, as strings to find in it."""
    wanted = []
    if info["range"]:
        lo, hi = info["range"]
        wanted.append(f"≥ {lo}" if hi == UINT64_MAX else f"{lo}..{hi}")
    if info["values"]:
        wanted += [f"`{v}`" for v in info["values"]]
    if info["array"]:
        wanted.append("array")
    return wanted


def read_reference(path):
    """The reference's entries: (line, heading, key or None, flags, values, default).

    An entry is a definition list item under "## Reference": the term names the key and
    its flag (`key` · `--flag ARG`; a flag alone, or a key alone), the first definition is
    "VALUES; default DEFAULT" (not for a flag without a key), the next says what it does.
    """
    rows = []
    heading = None
    in_reference = False
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        number = i + 1
        if line.startswith("## "):
            in_reference = line.strip() == "## Reference"
            continue
        if not in_reference:
            continue
        if line.startswith("### "):
            heading = line[4:].strip()
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not line.startswith("`") or not following.startswith(": "):
            continue
        spans = code_spans(line)
        keys = [span for span in spans if not span.startswith("-")]
        flags = [span.split()[0] for span in spans if span.startswith("-")]
        if len(keys) > 1:
            error(f"{REFERENCE}:{number}: an entry names {len(keys)} keys: one each")
        key = keys[0] if keys else None
        values = default = ""
        if key:
            values, sep, default = following[2:].partition("; default ")
            if not sep:
                error(f"{REFERENCE}:{number}: `{key}`'s first definition is not "
                      "'VALUES; default DEFAULT'")
            if not (i + 2 < len(lines) and lines[i + 2].startswith(": ")):
                error(f"{REFERENCE}:{number}: `{key}` has no definition saying what it does")
        rows.append((number, heading, key, flags, values, default))
    if len(rows) < 30:
        fail_now(f"{REFERENCE}: found {len(rows)} entries under '## Reference'")
    return rows


def help_text(parallaxd):
    out = subprocess.run([parallaxd, "--help"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        fail_now(f"{parallaxd} --help exited {out.returncode}: {out.stderr}")
    entries = {}  # flag -> its text, continuation lines included
    current = None
    for line in out.stdout.splitlines():
        m = re.match(r"\s{1,4}(--[a-z-]+)\b(.*)", line)
        if m:
            current = m.group(1)
            entries[current] = m.group(2)
        elif current and re.match(r"\s{8,}\S", line):
            entries[current] += " " + line.strip()
        else:
            current = None
    if len(entries) < 30:
        fail_now(f"found only {len(entries)} flags in {parallaxd} --help")
    return entries


def check_reference(src, keys, flags, keyless, help_entries):
    path = src / REFERENCE
    rows = read_reference(path)
    key_of_flag = flags
    flag_of_key = {key: flag for flag, key in flags.items()}
    seen_keys, seen_keyless = {}, set()
    defaults = {}
    for number, heading, key, row_flags, values, default in rows:
        where = f"{REFERENCE}:{number}"
        if key is None:
            for flag in row_flags:
                if flag in key_of_flag:
                    error(f"{where}: {flag} sets {key_of_flag[flag]}: give it that entry")
                elif flag not in keyless:
                    error(f"{where}: {flag} is documented but parallaxd takes no such flag")
                seen_keyless.add(flag)
            if not row_flags:
                error(f"{where}: an entry with neither key nor flag")
            continue
        if key not in keys:
            error(f"{where}: `{key}` is documented but the parser takes no such key")
            continue
        if key in seen_keys:
            error(f"{where}: `{key}` is documented twice (also line {seen_keys[key]})")
        seen_keys[key] = number
        defaults[key] = default
        want_flag = flag_of_key.get(key)
        if row_flags != ([want_flag] if want_flag else []):
            error(f"{where}: `{key}`'s flag is {want_flag or 'none'}, the entry says "
                  f"{', '.join(row_flags) or 'none'}")
        table = key.split(".")[0] if "." in key else None
        if table and f"`[{table}]`" not in (heading or ""):
            error(f"{where}: `{key}` is under '{heading}', not a heading naming `[{table}]`")
        if not table and heading != "Top-level keys":
            error(f"{where}: `{key}` is a top-level key, under '{heading}'")
        for wanted in expected_values(keys[key]):
            if wanted not in values:
                error(f"{where}: `{key}`'s values should say {wanted} (the parser's), "
                      f"the entry says '{values}'")
        if want_flag and help_entries and want_flag in help_entries:
            d = re.search(r"default:? (\d+)", help_entries[want_flag])
            if d and f"`{d.group(1)}`" not in default:
                error(f"{where}: `{key}`'s default is {d.group(1)} in parallaxd --help, the "
                      f"entry says '{default}'")
    for key in sorted(set(keys) - set(seen_keys)):
        error(f"{REFERENCE}: the key `{key}` ({flag_of_key.get(key, 'no flag')}) is not in "
              "the reference")
    for flag in sorted(keyless - seen_keyless):
        error(f"{REFERENCE}: the flag {flag} is not in the reference")
    return defaults


def check_help(flags, keyless, help_entries):
    taken = set(flags) | keyless
    listed = set(help_entries)
    for flag in sorted(listed - taken):
        error(f"parallaxd --help lists {flag}, which the parser does not take")
    for flag in sorted(taken - listed):
        if flag not in KNOWN_MISSING_FROM_HELP:
            error(f"parallaxd --help does not list {flag}")
    for flag in sorted(set(KNOWN_MISSING_FROM_HELP) & listed):
        error(f"parallaxd --help lists {flag} now: remove it from KNOWN_MISSING_FROM_HELP")


# --- configuration files ------------------------------------------------------------------

def flatten(document):
    """(key, value) of a parsed TOML document, keys of tables as table.key."""
    for name, value in document.items():
        if isinstance(value, dict):
            for sub, subvalue in value.items():
                yield f"{name}.{sub}", subvalue
        else:
            yield name, value


def check_settings(where, document, keys, tables):
    """Keys and values as the parser takes them; returns the keys."""
    found = {}
    for name, value in document.items():
        if isinstance(value, dict) and name not in tables:
            error(f"{where}: [{name}] is not a table parallaxd knows")
    for key, value in flatten(document):
        if key not in keys:
            if key.split(".")[0] in tables or "." not in key:
                error(f"{where}: `{key}` is not a key parallaxd knows")
            continue
        found[key] = value
        info = keys[key]
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) != info["array"]:
            error(f"{where}: `{key}` should {'' if info['array'] else 'not '}be an array")
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                error(f"{where}: `{key}` = {item!r} has a type parallaxd refuses")
            elif info["range"]:
                lo, hi = info["range"]
                if not (isinstance(item, int) and lo <= item <= hi) and not (
                        isinstance(item, str) and item.isdigit() and lo <= int(item) <= hi):
                    error(f"{where}: `{key}` = {item!r} is not an integer in {lo}..{hi}")
            elif info["values"] and item not in info["values"]:
                error(f"{where}: `{key}` = {item!r} is not one of {', '.join(info['values'])}")
    return found


def own_group():
    return grp.getgrgid(os.getegid()).gr_name


def daemon_accepts(parallaxd, where, path, scratch):
    # The group must exist here and the socket's directory be ours: override both.
    out = subprocess.run([parallaxd, "--config", str(path), "--group", own_group(),
                          "--socket", os.path.join(scratch, "check.sock"), "--check-config"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        message = out.stderr.strip().replace(f"{path}: ", "")
        error(f"{where}: parallaxd --check-config refuses it: {message}")


def check_packaging(src, keys, tables, defaults, parallaxd, scratch):
    path = src / "packaging/parallaxd.toml"
    where = "packaging/parallaxd.toml"
    text = path.read_text()
    shown = re.sub(r"(?m)^#\s*([a-z_]+\s*=\s)", r"\1", text)
    try:
        document = tomllib.loads(shown)
    except tomllib.TOMLDecodeError as e:
        error(f"{where}, its commented-out keys uncommented: not TOML: {e}")
        return
    found = check_settings(where, document, keys, tables)
    for key in sorted(set(keys) - set(found)):
        error(f"{where}: `{key}` is not shown (the file shows every key)")
    for key, value in found.items():
        info = keys[key]
        if key not in defaults:
            continue
        # A default that is another key's value (`node_count`) has no literal to compare.
        if re.fullmatch(r"`([a-z_.]+)`", defaults[key]) and defaults[key].strip("`") in keys:
            continue
        literal = str(value) if isinstance(value, int) else value
        if (isinstance(value, int) or info["values"]) and not isinstance(value, list) \
                and f"`{literal}`" not in defaults[key]:
            error(f"{where}: `{key}` = {value!r}, but the reference's default is "
                  f"'{defaults[key]}'")
    if parallaxd:
        daemon_accepts(parallaxd, where, path, scratch)


def check_pages(src, keys, tables, flags, keyless, parallaxd, scratch):
    pages = sorted((src / "docs").rglob("*.md")) + [src / "README.md"]
    pages = [p for p in pages if "_build" not in p.parts and p.exists()]
    taken = set(flags) | keyless
    table_re = "|".join(sorted(tables))
    for page in pages:
        name = str(page.relative_to(src))
        text = page.read_text()
        for i, m in enumerate(re.finditer(r"(?ms)^```toml\n(.*?)^```", text)):
            line = text.count("\n", 0, m.start()) + 1
            where = f"{name}:{line}"
            try:
                document = tomllib.loads(m.group(1))
            except tomllib.TOMLDecodeError as e:
                error(f"{where}: a toml block that is not TOML: {e}")
                continue
            check_settings(where, document, keys, tables)
            if parallaxd:
                block = pathlib.Path(scratch, f"block{i}.toml")
                block.write_text(m.group(1))
                daemon_accepts(parallaxd, where, block, scratch)
        for m in re.finditer(rf"`((?:{table_re})\.[a-z_]+)\b(?!\.)", text):
            if m.group(1) not in keys:
                line = text.count("\n", 0, m.start()) + 1
                error(f"{name}:{line}: `{m.group(1)}` is not a key parallaxd knows")
        # parallaxd as the command (a line's, a code span's, after && or ;), not an argument.
        for m in re.finditer(r"(?m)(?:^|`|&& |; |\$ )\s*(?:[\w.-]*/)*parallaxd((?: [^`\n]*)?)",
                             text):
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", m.group(1)):
                if flag not in taken:
                    line = text.count("\n", 0, m.start()) + 1
                    error(f"{name}:{line}: `parallaxd ... {flag}`: parallaxd takes no such flag")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[-1])
    src = pathlib.Path(sys.argv[1])
    parallaxd = sys.argv[2] if len(sys.argv) == 3 else None
    keys, tables, flags, keyless = read_parser(src)
    print(f"config-reference: the parser takes {len(keys)} keys in {len(tables)} tables, "
          f"{len(flags)} flags with a key and {len(keyless)} without", flush=True)
    help_entries = {}
    if parallaxd:
        help_entries = help_text(parallaxd)
        check_help(flags, keyless, help_entries)
    else:
        print("config-reference: no parallaxd given: --help and --check-config not checked")
    defaults = check_reference(src, keys, flags, keyless, help_entries)
    with tempfile.TemporaryDirectory(prefix="pxt-config-ref-") as scratch:
        check_packaging(src, keys, tables, defaults, parallaxd, scratch)
        check_pages(src, keys, tables, flags, keyless, parallaxd, scratch)
    for message in errors:
        print(f"config-reference: FAIL: {message}")
    if errors:
        print(f"config-reference: {len(errors)} disagreements between the parser and "
              f"{REFERENCE}, the example configuration or the docs")
        sys.exit(1)
    print(f"config-reference: ok: {REFERENCE} documents every key and flag as the parser "
          "takes them; the example configuration and the docs' keys and flags agree")


if __name__ == "__main__":
    main()
