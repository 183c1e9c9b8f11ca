#!/usr/bin/python3
"""Checks that the Rust, Julia and Python bindings declare exactly what
include/parallax_c.h does.

    check_bindings.py --header include/parallax_c.h --rust clients/rust/src/sys.rs
    check_bindings.py --header include/parallax_c.h --julia clients/julia/Parallax/src
    check_bindings.py --header include/parallax_c.h --python clients/python/parallax/_lib.py
    check_bindings.py --self-test

From the header it takes every PX_API function (name, return and parameter types), every
struct (fields and their types, in order), every enum value and the integer #defines.
Rust (the sys module): every `extern "C"` fn must be a header function with the same
parameter count and C-equivalent types, every header function must be declared (or named
in a `// check_bindings: omit px_name: reason` comment), every `#[repr(C)]` struct named
like a header struct must have the same fields and types in order, every header struct a
Rust one, and every enum value and define a `pub const` of that value. Julia: every
`ccall((:px_name, lib), Ret, (Args...,), ...)` likewise (a `# check_bindings: omit` comment
for the rest), and every struct `PxCamelCase` mirroring `px_camel_case`. Python (ctypes,
`_lib.py`): every `_SIGNATURES` entry likewise (a function left out must have its `_ex`
variant there), every `Structure` `CamelCase` mirroring `px_camel_case`, every status
constant. Python stdlib only.
"""
import argparse
import ast
import os
import re
import sys

# --- C types ------------------------------------------------------------------------
# A type is ("base", name) or ("ptr", pointee_const, pointee_type).


def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def parse_c_type(text):
    """'const char*' -> ('ptr', True, ('base', 'char')); 'px_request* const*' -> ..."""
    tokens = re.findall(r"\*|[A-Za-z_]\w*", text)
    const = False
    base = None
    for t in tokens:
        if t == "const":
            const = True
        elif t == "*":
            break
        elif t in ("struct", "enum"):
            continue
        elif base is None:
            base = t
        else:
            base += " " + t  # "unsigned int" and the like
    if base is None:
        raise ValueError("no type in %r" % text)
    typ = ("base", base)
    rest = tokens[tokens.index("*"):] if "*" in tokens else []
    pointee_const = const
    i = 0
    while i < len(rest):
        assert rest[i] == "*"
        typ = ("ptr", pointee_const, typ)
        pointee_const = False
        i += 1
        if i < len(rest) and rest[i] == "const":
            pointee_const = True  # the pointer just built is const: the next one's pointee
            i += 1
    return typ


def c_type_str(t):
    if t[0] == "base":
        return t[1]
    inner = c_type_str(t[2])
    return ("const " if t[1] and t[2][0] == "base" else "") + inner + (
        " const*" if t[1] and t[2][0] == "ptr" else "*")


def split_top(text, sep=","):
    """Splits at sep outside (), [], {}."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


def split_decl(decl):
    """'const char* socket_path' -> ('const char*', 'socket_path')."""
    m = re.match(r"^(.*?)([A-Za-z_]\w*)\s*(\[\s*\w*\s*\])?$", decl.strip(), re.S)
    if not m:
        raise ValueError("cannot parse declaration %r" % decl)
    return m.group(1).strip(), m.group(2)


def eval_define(expr, known):
    expr = re.sub(r"\(\s*u?int\d+_t\s*\)", "", expr)
    expr = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)[uUlL]*\b", r"\1", expr)
    node = ast.parse(expr.strip(), mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load,
               ast.LShift, ast.RShift, ast.BitOr, ast.BitAnd, ast.Add, ast.Sub, ast.Mult,
               ast.USub)
    for n in ast.walk(node):
        if not isinstance(n, allowed):
            raise ValueError("not an integer expression: %r" % expr)
        if isinstance(n, ast.Name) and n.id not in known:
            raise ValueError("unknown name %s in %r" % (n.id, expr))
    return eval(compile(node, "<define>", "eval"), {"__builtins__": {}}, dict(known))


class Header:
    def __init__(self, text):
        raw = text
        text = strip_c_comments(text)
        self.defines = {}
        for m in re.finditer(r"^\s*#define\s+(PX_\w+)\s+(.+)$", raw, re.M):
            value = strip_c_comments(m.group(2)).strip()
            try:
                self.defines[m.group(1)] = eval_define(value, self.defines)
            except (ValueError, SyntaxError):
                pass  # PX_API and other non-integer macros
        self.enums = {}  # type name -> {member: value}
        self.enum_values = {}
        for m in re.finditer(r"typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
            members, value = {}, -1
            for item in split_top(m.group(1)):
                name, _, expr = item.partition("=")
                value = eval_define(expr, self.enum_values) if expr.strip() else value + 1
                members[name.strip()] = value
                self.enum_values[name.strip()] = value
            self.enums[m.group(2)] = members
        self.opaque = set(re.findall(r"typedef\s+struct\s+(\w+)\s+\1\s*;", text))
        self.structs = {}  # name -> [(field, type)]
        for m in re.finditer(r"typedef\s+struct\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
            fields = []
            for decl in m.group(1).split(";"):
                if not decl.strip():
                    continue
                first, *more = split_top(decl)
                ctype, name = split_decl(first)
                fields.append((name, parse_c_type(ctype)))
                for extra in more:  # "double init_low, init_high"
                    fields.append((extra.strip(), parse_c_type(ctype)))
            self.structs[m.group(2)] = fields
        self.functions = {}  # name -> (return type, [(param, type)])
        for m in re.finditer(r"PX_API\s+([^;{]*?)\b(px_\w+)\s*\(([^)]*)\)\s*;", text, re.S):
            params = []
            if m.group(3).strip() not in ("", "void"):
                for p in split_top(m.group(3)):
                    ctype, name = split_decl(p)
                    params.append((name, parse_c_type(ctype)))
            self.functions[m.group(2)] = (parse_c_type(m.group(1)), params)
        if not self.functions or not self.structs or not self.enums:
            raise ValueError("the header parsed to nothing: is it parallax_c.h?")

    def type_kind(self, t):
        if t[0] == "base":
            if t[1] in self.enums:
                return "enum"
            if t[1] in self.opaque:
                return "opaque"
            if t[1] in self.structs:
                return "struct"
        return t[0]


def omitted(text, comment):
    return set(re.findall(comment + r"\s*check_bindings:\s*omit\s+(px_\w+)", text))


# --- Rust ---------------------------------------------------------------------------
RUST_BASE = {
    "uint32_t": {"u32"}, "int32_t": {"i32"}, "uint64_t": {"u64"}, "int64_t": {"i64"},
    "uint16_t": {"u16"}, "int16_t": {"i16"}, "uint8_t": {"u8"}, "int8_t": {"i8"},
    "int": {"c_int"}, "unsigned int": {"c_uint"}, "char": {"c_char"}, "void": {"c_void"},
    "double": {"f64"}, "float": {"f32"}, "size_t": {"usize"},
}


def parse_rust_type(text):
    text = text.strip()
    m = re.match(r"^\*\s*(const|mut)\s+(.*)$", text, re.S)
    if m:
        return ("ptr", m.group(1) == "const", parse_rust_type(m.group(2)))
    text = re.sub(r"^(std::os::raw::|core::ffi::|std::ffi::|libc::)", "", text)
    return ("base", text)


def rust_type_str(t):
    if t[0] == "base":
        return t[1]
    return "*%s %s" % ("const" if t[1] else "mut", rust_type_str(t[2]))


def check_rust(header, text):
    errors = []
    code = re.sub(r"//[^\n]*", "", text)
    aliases = dict(re.findall(r"pub\s+type\s+(\w+)\s*=\s*([\w:]+)\s*;", code))
    for enum in header.enums:
        if enum in aliases and aliases[enum].split("::")[-1] not in ("i32", "c_int"):
            errors.append("rust: type %s = %s; a C enum is a 32-bit int (i32 or c_int)"
                          % (enum, aliases[enum]))
    repr_c = {}
    for m in re.finditer(r"((?:#\[[^\]]*\]\s*)*)pub\s+struct\s+(\w+)\s*\{(.*?)\}", code, re.S):
        fields = []
        for f in split_top(m.group(3)):
            fm = re.match(r"^(?:pub(?:\([^)]*\))?\s+)?(\w+)\s*:\s*(.+)$", f.strip(), re.S)
            if not fm:
                errors.append("rust: struct %s: cannot parse field %r" % (m.group(2), f))
                continue
            fields.append((fm.group(1), parse_rust_type(fm.group(2))))
        repr_c[m.group(2)] = ("repr(C)" in m.group(1).replace(" ", ""), fields)

    def same(ctype, rtype, where):
        if ctype[0] == "ptr":
            if rtype[0] != "ptr":
                return False
            if ctype[1] != rtype[1]:
                return False
            return same(ctype[2], rtype[2], where)
        if rtype[0] != "base":
            return False
        c, r = ctype[1], rtype[1]
        kind = header.type_kind(ctype)
        if kind == "enum":
            if r == c:
                return c in aliases
            return r in ("i32", "c_int")
        if kind in ("opaque", "struct"):
            if r != c:
                return False
            if r not in repr_c:
                errors.append("rust: %s uses %s, which is not declared" % (where, r))
            return True
        return r in RUST_BASE.get(c, set())

    blocks = re.findall(r'extern\s+"C"\s*\{(.*?)\n\}', code, re.S)
    fns = {}
    for block in blocks:
        for m in re.finditer(r"pub\s+fn\s+(\w+)\s*\((.*?)\)\s*(?:->\s*([^;]+?))?\s*;", block,
                             re.S):
            params = []
            for p in split_top(m.group(2)):
                name, _, typ = p.partition(":")
                params.append((name.strip(), parse_rust_type(typ)))
            ret = parse_rust_type(m.group(3)) if m.group(3) else ("base", "()")
            if m.group(1) in fns:
                errors.append("rust: fn %s is declared twice" % m.group(1))
            fns[m.group(1)] = (ret, params)
    if not fns:
        errors.append('rust: no extern "C" functions found')
    for name, (ret, params) in sorted(fns.items()):
        if name not in header.functions:
            errors.append("rust: fn %s is not a function of the header" % name)
            continue
        cret, cparams = header.functions[name]
        if cret == ("base", "void"):
            if ret != ("base", "()"):
                errors.append("rust: fn %s returns %s; the header returns void"
                              % (name, rust_type_str(ret)))
        elif not same(cret, ret, name + " return"):
            errors.append("rust: fn %s returns %s; the header returns %s"
                          % (name, rust_type_str(ret), c_type_str(cret)))
        if len(params) != len(cparams):
            errors.append("rust: fn %s takes %d arguments; the header's takes %d"
                          % (name, len(params), len(cparams)))
            continue
        for i, ((_, pt), (cn, ct)) in enumerate(zip(params, cparams)):
            if not same(ct, pt, "%s argument %d" % (name, i + 1)):
                errors.append("rust: fn %s argument %d (%s): %s is not C's %s"
                              % (name, i + 1, cn, rust_type_str(pt), c_type_str(ct)))
    skip = omitted(text, "//")
    for name in sorted(set(header.functions) - set(fns) - skip):
        errors.append("rust: header function %s is not declared (declare it, or add "
                      "'// check_bindings: omit %s: why')" % (name, name))
    for name in sorted(skip & set(fns)):
        errors.append("rust: %s is both declared and listed as omitted" % name)
    for name, cfields in sorted(header.structs.items()):
        if name not in repr_c:
            errors.append("rust: struct %s is not declared" % name)
            continue
        is_c, rfields = repr_c[name]
        if not is_c:
            errors.append("rust: struct %s lacks #[repr(C)]" % name)
        errors += compare_fields("rust", name, cfields, rfields,
                                 lambda c, r, w: same(c, r, w), rust_type_str)
    for name in sorted(header.opaque):
        if name not in repr_c or not repr_c[name][0]:
            errors.append("rust: opaque handle %s needs a #[repr(C)] struct" % name)
    errors += check_consts("rust", header, dict(
        (n, v) for n, v in re.findall(r"pub\s+const\s+(\w+)\s*:\s*[\w:]+\s*=\s*([^;]+);", code)))
    return errors


def compare_fields(lang, name, cfields, bfields, same, type_str):
    errors = []
    cnames = [f for f, _ in cfields]
    bnames = [f for f, _ in bfields]
    if cnames != bnames:
        errors.append("%s: struct %s has fields %s; the header's has %s"
                      % (lang, name, ", ".join(bnames), ", ".join(cnames)))
        return errors
    for (fname, ct), (_, bt) in zip(cfields, bfields):
        if not same(ct, bt, "%s.%s" % (name, fname)):
            errors.append("%s: struct %s field %s: %s is not C's %s"
                          % (lang, name, fname, type_str(bt), c_type_str(ct)))
    return errors


def check_consts(lang, header, consts):
    errors = []
    values = {}
    for name, expr in consts.items():
        try:
            # Julia spells typed literals as conversions: Cint(15), UInt64(1) << 20.
            values[name] = eval_define(
                re.sub(r"\b(?:Cint|Int32|UInt32|UInt64|Int64|Cuint)\(([^()]*)\)", r"(\1)",
                       expr.strip()), values)
        except (ValueError, SyntaxError):
            pass
    for name, value in sorted(header.enum_values.items()):
        if name not in values:
            errors.append("%s: enum value %s (= %d) is not declared" % (lang, name, value))
        elif values[name] != value:
            errors.append("%s: %s is %d; the header says %d" % (lang, name, values[name], value))
    for name, value in sorted(header.defines.items()):
        if name in values and values[name] != value:
            errors.append("%s: %s is %d; the header says %d" % (lang, name, values[name], value))
    return errors


# --- Julia --------------------------------------------------------------------------
JULIA_BASE = {
    "uint32_t": {"UInt32", "Cuint"}, "int32_t": {"Int32", "Cint"},
    "uint64_t": {"UInt64", "Culonglong"}, "int64_t": {"Int64", "Clonglong"},
    "int": {"Cint"}, "unsigned int": {"Cuint"}, "char": {"Cchar", "UInt8", "Int8"},
    "void": {"Cvoid"}, "double": {"Float64", "Cdouble"}, "float": {"Float32", "Cfloat"},
    "size_t": {"Csize_t", "UInt"},
}


def julia_struct_name(c_name):
    return "".join(part.capitalize() for part in c_name.split("_"))


def parse_julia_type(text):
    text = text.strip()
    m = re.match(r"^(Ptr|Ref)\{(.*)\}$", text, re.S)
    if m:
        return (m.group(1), parse_julia_type(m.group(2)))
    return ("base", text)


def julia_type_str(t):
    return t[1] if t[0] == "base" else "%s{%s}" % (t[0], julia_type_str(t[1]))


def julia_same(header, structs, ctype, jtype, top, where, errors):
    """top: a ccall argument or return (Ref and Cstring allowed there)."""
    if ctype[0] == "ptr":
        pointee = ctype[2]
        if jtype == ("base", "Cstring"):
            return top and pointee == ("base", "char") and ctype[1]  # const char* only
        if jtype[0] not in ("Ptr", "Ref") or (jtype[0] == "Ref" and not top):
            return False
        if header.type_kind(pointee) == "opaque":
            return jtype[1] == ("base", "Cvoid")
        return julia_same(header, structs, pointee, jtype[1], False, where, errors)
    if jtype[0] != "base":
        return False
    kind = header.type_kind(ctype)
    if kind == "enum":
        return jtype[1] in ("Cint", "Int32")
    if kind == "struct":
        want = julia_struct_name(ctype[1])
        if jtype[1] == want and want not in structs:
            errors.append("julia: %s uses %s, which is not declared" % (where, want))
        return jtype[1] == want
    return jtype[1] in JULIA_BASE.get(ctype[1], set())


def balanced(text, start):
    """The text from start (an open paren) to its matching close paren, exclusive."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
    raise ValueError("unbalanced parentheses from offset %d" % start)


def check_julia(header, text):
    errors = []
    code = re.sub(r"#=.*?=#", "", text, flags=re.S)
    code = re.sub(r"#[^\n]*", "", code)
    structs = {}
    for m in re.finditer(r"^\s*(mutable\s+)?struct\s+(\w+)\s*\n(.*?)^\s*end\b", code, re.S | re.M):
        fields = []
        if not m.group(2).startswith("Px"):
            continue  # only the mirrors of C structs are compared (no inner constructors)
        for line in m.group(3).splitlines():
            fm = re.match(r"^\s*(\w+)\s*::\s*(\S.*?)\s*$", line)
            if fm:
                fields.append((fm.group(1), parse_julia_type(fm.group(2))))
            elif line.strip():
                errors.append("julia: struct %s: %r is not a typed field" % (m.group(2), line))
        if m.group(1):
            errors.append("julia: struct %s must be immutable (isbits, laid out as C)"
                          % m.group(2))
        structs[m.group(2)] = fields
    calls = {}
    for m in re.finditer(r"\bccall\s*\(", code):
        args = split_top(balanced(code, m.end() - 1))
        target = re.match(r"^\(\s*:(\w+)\s*,", args[0]) if args else None
        if not target:
            errors.append("julia: a ccall without a (:symbol, library) target: %r"
                          % code[m.start():m.start() + 60])
            continue
        name = target.group(1)
        if len(args) < 3 or not (args[2].startswith("(") and args[2].endswith(")")):
            errors.append("julia: ccall of %s: argument types must be a literal tuple" % name)
            continue
        types = [parse_julia_type(t) for t in split_top(args[2][1:-1])]
        values = args[3:]
        if len(values) != len(types):
            errors.append("julia: ccall of %s passes %d values for %d argument types"
                          % (name, len(values), len(types)))
        calls.setdefault(name, []).append((parse_julia_type(args[1]), types))
    if not calls:
        errors.append("julia: no ccall found")
    for name, uses in sorted(calls.items()):
        if name not in header.functions:
            errors.append("julia: ccall of %s, which is not a function of the header" % name)
            continue
        cret, cparams = header.functions[name]
        for ret, types in uses:
            if not julia_same(header, structs, cret, ret, True, name, errors):
                errors.append("julia: ccall of %s returns %s; the header returns %s"
                              % (name, julia_type_str(ret), c_type_str(cret)))
            if len(types) != len(cparams):
                errors.append("julia: ccall of %s has %d argument types; the header's takes %d"
                              % (name, len(types), len(cparams)))
                continue
            for i, (jt, (cn, ct)) in enumerate(zip(types, cparams)):
                if not julia_same(header, structs, ct, jt, True, name, errors):
                    errors.append("julia: ccall of %s argument %d (%s): %s is not C's %s"
                                  % (name, i + 1, cn, julia_type_str(jt), c_type_str(ct)))
    skip = omitted(text, "#")
    for name in sorted(set(header.functions) - set(calls) - skip):
        errors.append("julia: header function %s has no ccall (add one, or a "
                      "'# check_bindings: omit %s: why' comment)" % (name, name))
    for name in sorted(skip & set(calls)):
        errors.append("julia: %s is both called and listed as omitted" % name)
    for cname, cfields in sorted(header.structs.items()):
        jname = julia_struct_name(cname)
        if jname not in structs:
            errors.append("julia: struct %s (mirroring %s) is not declared" % (jname, cname))
            continue
        errors += compare_fields(
            "julia", jname, cfields, structs[jname],
            lambda c, j, w: julia_same(header, structs, c, j, False, w, errors), julia_type_str)
    errors += check_consts("julia", header, dict(
        re.findall(r"^\s*const\s+(PX_\w+)\s*=\s*(.+?)\s*$", code, re.M)))
    return errors


# --- self-test ----------------------------------------------------------------------
# --- Python (ctypes) ----------------------------------------------------------------
PY_BASE = {
    "c_uint32": {"uint32_t"}, "c_int32": {"int32_t"}, "c_uint64": {"uint64_t"},
    "c_int64": {"int64_t"}, "c_int": {"int"}, "c_double": {"double"}, "c_char": {"char"},
}


def _py_type(node, aliases):
    """A ctypes annotation from the AST: ("base", name), ("ptr", inner), ("void_p",),
    ("char_p",), ("struct", class) or None for a restype of None."""
    if isinstance(node, ast.Constant) and node.value is None:
        return ("void",)
    if isinstance(node, ast.Name):
        if node.id in aliases:
            return _py_type(aliases[node.id], aliases)
        if node.id == "c_void_p":
            return ("void_p",)
        if node.id == "c_char_p":
            return ("char_p",)
        if node.id in PY_BASE:
            return ("base", node.id)
        return ("struct", node.id)
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "POINTER":
        return ("ptr", _py_type(node.args[0], aliases))
    raise ValueError("cannot read the ctypes type %s" % ast.dump(node))


def py_struct_name(c_name):
    """px_connect_options -> ConnectOptions (the Python module's naming)."""
    return "".join(w.capitalize() for w in c_name[3:].split("_"))


def py_same(header, ct, pt):
    """Whether the ctypes type pt passes what the C type ct is."""
    kind = header.type_kind(ct)
    if pt[0] == "void":
        return ct == ("base", "void")
    if kind == "enum":
        return pt == ("base", "c_int")
    if ct[0] == "base":
        return pt[0] == "base" and ct[1] in PY_BASE[pt[1]]
    pointee = ct[2]
    if pt[0] == "char_p":
        return pointee == ("base", "char")
    if pt[0] == "void_p":  # opaque handles and void* travel as void*
        return header.type_kind(pointee) == "opaque" or pointee == ("base", "void")
    if pt[0] != "ptr":
        return False
    inner = pt[1]
    if inner[0] == "void_p":  # px_client**, px_request* const*, void**
        return pointee[0] == "ptr" and (header.type_kind(pointee[2]) == "opaque"
                                        or pointee[2] == ("base", "void"))
    if inner[0] == "struct":
        return header.type_kind(pointee) == "struct" and py_struct_name(pointee[1]) == inner[1]
    return py_same(header, pointee, inner)


def check_python(header, text):
    """The ctypes module (clients/python/parallax/_lib.py): _SIGNATURES against the header's
    functions (a function it leaves out must have its _ex variant declared), its Structure
    classes against the header's structs, its constants against the enum values."""
    errors = []
    tree = ast.parse(text)
    aliases, signatures, structs, consts = {}, None, {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                if target.id == "_SIGNATURES":
                    signatures = node.value
                elif target.id.startswith("_") and target.id[1:].isupper():
                    aliases[target.id] = node.value
                elif isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
                    consts["PX_" + target.id] = node.value.value
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Call):
                names = [e.id for e in target.elts]  # F32, F64, ... = range(6)
                start = node.value.args[0].value if len(node.value.args) == 2 else 0
                for i, n in enumerate(names):
                    consts["PX_" + n] = start + i
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.Assign) and item.targets[0].id == "_fields_":
                    structs[node.name] = [(e.elts[0].value, _py_type(e.elts[1], aliases))
                                          for e in item.value.elts]
    if signatures is None:
        return ["python: no _SIGNATURES table"]
    declared = {}
    for key, value in zip(signatures.keys, signatures.values):
        restype, argtypes = value.elts
        declared[key.value] = (_py_type(restype, aliases),
                               [_py_type(a, aliases) for a in argtypes.elts])
    for name, (ret, args) in declared.items():
        if name not in header.functions:
            errors.append("python: %s is not in the header" % name)
            continue
        cret, cparams = header.functions[name]
        if not py_same(header, cret, ret):
            errors.append("python: %s returns %s, not C's %s" % (name, ret, c_type_str(cret)))
        if len(args) != len(cparams):
            errors.append("python: %s takes %d arguments; the header's takes %d"
                          % (name, len(args), len(cparams)))
            continue
        for i, ((pname, ct), pt) in enumerate(zip(cparams, args)):
            if not py_same(header, ct, pt):
                errors.append("python: %s argument %d (%s): %s is not C's %s"
                              % (name, i + 1, pname, pt, c_type_str(ct)))
    for name in sorted(header.functions):
        if name not in declared and name + "_ex" not in declared:
            errors.append("python: %s is not declared (nor its _ex variant)" % name)
    for cname, cfields in sorted(header.structs.items()):
        pname = py_struct_name(cname)
        if pname not in structs:
            errors.append("python: no Structure %s for %s" % (pname, cname))
            continue
        pfields = structs[pname]
        if [f for f, _ in pfields] != [f for f, _ in cfields]:
            errors.append("python: %s has fields %s; the header's has %s"
                          % (pname, ", ".join(f for f, _ in pfields),
                             ", ".join(f for f, _ in cfields)))
            continue
        for (fname, ct), (_, pt) in zip(cfields, pfields):
            if not py_same(header, ct, pt):
                errors.append("python: %s.%s: %s is not C's %s" % (pname, fname, pt,
                                                                   c_type_str(ct)))
    for name, value in sorted(header.enum_values.items()):
        if name.startswith("PX_ERR_") and name not in consts:
            errors.append("python: status %s (= %d) is not declared" % (name, value))
        if name in consts and consts[name] != value:
            errors.append("python: %s is %d; the header says %d" % (name, consts[name], value))
    return errors


def self_test(header_path, rust_path, julia_dir, python_path):
    """Feeds wrong declarations and expects each to be reported."""
    header = Header(read(header_path))
    rust = read(rust_path)
    julia = read_julia(julia_dir)
    python = read(python_path)
    failures = []
    checkers = {"rust": check_rust, "julia": check_julia, "python": check_python}

    def expect(lang, text, mutated, needle):
        if mutated == text:
            failures.append("self-test: the mutation for %r did not apply" % needle)
            return
        errs = checkers[lang](header, mutated)
        if not any(needle in e for e in errs):
            failures.append("self-test: %s mutation not caught (wanted %r, got %s)"
                            % (lang, needle, errs or "no errors"))

    if check_rust(header, rust) or check_julia(header, julia) or check_python(header, python):
        failures.append("self-test: the bindings as they are must pass first")
    expect("rust", rust, rust.replace("timeout_ms: i64) -> px_status;\n    pub fn px_test",
                                      "timeout_ms: i32) -> px_status;\n    pub fn px_test"),
           "fn px_wait argument 2 (timeout_ms): i32 is not C's int64_t")
    expect("rust", rust, re.sub(r"pub fn px_barrier\(client: \*mut px_client, timeout_ms: i64\)",
                                "pub fn px_barrier(client: *mut px_client)", rust),
           "fn px_barrier takes 1 arguments; the header's takes 2")
    expect("rust", rust, rust.replace("out_client: *mut *mut px_client",
                                      "out_client: *mut px_client"),
           "fn px_connect argument 2 (out_client)")
    expect("rust", rust, rust.replace("pub fn px_status_name(status: px_status) -> *const c_char;",
                                      "pub fn px_status_name(status: px_status) -> *mut c_char;"),
           "fn px_status_name returns *mut c_char")
    expect("rust", rust, re.sub(r"\n\s*pub fn px_request_cancel\([^;]*;", "", rust),
           "header function px_request_cancel is not declared")
    expect("rust", rust, rust.replace("    pub local_rank: i32,\n    pub local_size: i32,",
                                      "    pub local_size: i32,\n    pub local_rank: i32,"),
           "struct px_connect_options has fields")
    expect("rust", rust, rust.replace("pub init_seed: u64,", "pub init_seed: i64,"),
           "struct px_sparse_options field init_seed: i64 is not C's uint64_t")
    expect("rust", rust, rust.replace("PX_ERR_INDEX: px_status = 11", "PX_ERR_INDEX: px_status = 12"),
           "PX_ERR_INDEX is 12; the header says 11")
    expect("rust", rust, rust.replace("pub fn px_abi_version()", "pub fn px_abi_versio()"),
           "fn px_abi_versio is not a function of the header")
    expect("julia", julia, re.sub(r"(ccall\(\(:px_wait, \w+\(\)\), Cint, \(Ptr\{Cvoid\}, )Int64",
                                  r"\1Int32", julia),
           "ccall of px_wait argument 2 (timeout_ms): Int32 is not C's int64_t")
    expect("julia", julia, julia.replace("    arena_bytes::UInt64\n", "    arena_bytes::Int64\n"),
           "struct PxConnectOptions field arena_bytes: Int64 is not C's uint64_t")
    expect("julia", julia, re.sub(r"ccall\(\(:px_barrier, (\w+\(\))\), Cint, \(Ptr\{Cvoid\}, Int64\), "
                                  r"(\w+), (\w+)\)",
                                  r"ccall((:px_barrier, \1), Cint, (Ptr{Cvoid},), \2)", julia),
           "ccall of px_barrier has 1 argument types; the header's takes 2")
    expect("julia", julia, julia.replace("(:px_request_cancel,", "(:px_request_cancel_,"),
           "header function px_request_cancel has no ccall")
    expect("julia", julia, julia.replace("const PX_ERR_CANCELLED = Cint(15)",
                                         "const PX_ERR_CANCELLED = Cint(16)"),
           "PX_ERR_CANCELLED is 16; the header says 15")
    expect("python", python, python.replace('"px_wait": (c_int, [_P, c_int64]),',
                                            '"px_wait": (c_int, [_P, c_int32]),'),
           "px_wait argument 2 (timeout_ms)")
    expect("python", python, python.replace('"px_barrier": (c_int, [_P, c_int64]),',
                                            '"px_barrier": (c_int, [_P]),'),
           "px_barrier takes 1 arguments; the header's takes 2")
    expect("python", python, python.replace('("init_seed", c_uint64)', '("init_seed", c_int64)'),
           "SparseOptions.init_seed")
    expect("python", python, python.replace('    "px_request_cancel": (c_int, [_P]),\n', ""),
           "px_request_cancel is not declared")
    expect("python", python, python.replace("ERR_CANCELLED = 15", "ERR_CANCELLED = 16"),
           "PX_ERR_CANCELLED is 16; the header says 15")
    # The header side: a struct field parsed from "double a, b" and a const pointer.
    assert ("init_high", ("base", "double")) in header.structs["px_sparse_options"]
    assert header.functions["px_wait_all"][1][0][1] == \
        ("ptr", True, ("ptr", False, ("base", "px_request")))
    return failures


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def read_julia(path):
    if os.path.isfile(path):
        return read(path)
    texts = []
    for root, _, files in os.walk(path):
        for name in sorted(files):
            if name.endswith(".jl"):
                texts.append(read(os.path.join(root, name)))
    if not texts:
        raise SystemExit("no .jl files under %s" % path)
    return "\n".join(texts)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--header", default=os.path.join(root, "include", "parallax_c.h"))
    ap.add_argument("--rust", help="the Rust sys module")
    ap.add_argument("--julia", help="the Julia module's src directory (or one file)")
    ap.add_argument("--python", help="the Python package's ctypes module (_lib.py)")
    ap.add_argument("--self-test", action="store_true",
                    help="also prove that wrong declarations are caught")
    args = ap.parse_args()
    header = Header(read(args.header))
    errors = []
    if args.rust:
        errors += check_rust(header, read(args.rust))
    if args.julia:
        errors += check_julia(header, read_julia(args.julia))
    if args.python:
        errors += check_python(header, read(args.python))
    if args.self_test:
        errors += self_test(args.header,
                            args.rust or os.path.join(here, "rust", "src", "sys.rs"),
                            args.julia or os.path.join(here, "julia", "Parallax", "src"),
                            args.python or os.path.join(here, "python", "parallax", "_lib.py"))
    if not (args.rust or args.julia or args.python or args.self_test):
        ap.error("nothing to check: give --rust, --julia, --python or --self-test")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print("%d mismatch(es) between the bindings and %s" % (len(errors), args.header),
              file=sys.stderr)
        return 1
    checked = [n for n, v in (("rust", args.rust), ("julia", args.julia),
                              ("python", args.python)) if v]
    print("%s: %d functions, %d structs, %d enum values match the header%s"
          % (" and ".join(checked) or "self-test", len(header.functions), len(header.structs),
             len(header.enum_values), "; self-test caught every mutation" if args.self_test
             else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
