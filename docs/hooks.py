"""Reference pages generated from the code when the site is built, so they cannot drift.

``mkdocs.yml`` loads this file as a hook. :func:`on_files` adds two pages that exist only in
the built site:

- ``reference/cli.md``: every ``perfsweep`` command and its options (name, type, the default
  ``--help`` shows, help), read from the typer app's click command tree
  (``typer.main.get_command``). Hidden options are left out; every cell is escaped, so a
  choice list (``a|b``) stays in its cell.
- ``reference/scenario.md``: every scenario key (type, default, unit, flag, environment
  variable, meaning), read from the scenario's pydantic models and their field docstrings.
  The flags that set a key are found in the source: the dotted keys (``"goals.p99_ms"``) of
  the override dicts that the commands build, traced back to the command's parameters.

Both functions are pure apart from importing ``analyzer`` and reading its source files.
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMANDS_DIR = REPO_ROOT / "analyzer" / "commands"
CONFIG_DIR = REPO_ROOT / "analyzer" / "config"
#: Modules outside ``analyzer/commands`` whose functions build scenario overrides from a
#: command's request object (``perfsweep gate`` builds its scenario in its library call).
LIBRARY_SOURCES = (REPO_ROOT / "analyzer" / "gate" / "run.py",)

#: A key of an override dict: ``objective`` or ``section.key``.
_DOTTED = re.compile(r"^(objective|[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*)$")
#: Units by the suffix of a key's name (the project names units in names: ``p99_ms``).
UNITS = (
    ("_ms", "ms"),
    ("_us", "µs"),
    ("_rps", "req/s"),
    ("_mb", "MiB"),
    ("_bytes", "bytes"),
    ("_pct", "%"),
    ("_s", "s"),
)
ENV_PREFIX = "PERFSWEEP_"

# -- text helpers ---------------------------------------------------------------------------------

_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")


def rst_to_markdown(text: str) -> str:
    """A docstring's reStructuredText markup as Markdown, on one line."""
    text = _ROLE.sub(lambda m: f"`{m.group(2).split('.')[-1] if m.group(1) else m.group(2)}`", text)
    text = text.replace("``", "`")
    return " ".join(text.split())


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, pipes escaped, and ``<``, ``>`` and
    ``&`` written as entities outside code spans (``<model>`` is text, not an HTML tag)."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def unit_of(key: str) -> str:
    """The unit a key's name states (``p99_ms`` -> ``ms``), or empty."""
    return next((unit for suffix, unit in UNITS if key.endswith(suffix)), "")


def env_name(dotted: str) -> str:
    """``goals.p99_ms`` -> ``PERFSWEEP_GOALS_P99_MS`` (the scenario's own rule)."""
    return ENV_PREFIX + dotted.replace(".", "_").upper()


# -- the CLI --------------------------------------------------------------------------------------


def _type_name(param: Any, ctx: Any) -> str:
    """The type ``--help`` shows, for typer's parameters and for plain click's."""
    if getattr(param, "is_flag", False) or getattr(param, "secondary_opts", None):
        return "flag"
    display = getattr(param, "display_type", None)
    if callable(display):
        text = str(display(ctx))
    else:  # plain click
        choices = getattr(param.type, "choices", None)
        text = "|".join(map(str, choices)) if choices else str(param.type.name)
    text = text.strip("<>")
    repeatable = bool(getattr(param, "multiple", False))
    if text.startswith("list[") and text.endswith("]"):
        text, repeatable = text[5:-1], True
    text = {"str": "text", "int": "integer", "float": "number", "Path": "path"}.get(text, text)
    return f"{text}, repeatable" if repeatable else text


def _default(param: Any, ctx: Any) -> str:
    """The default ``--help`` shows beside an option, by the help's own rule; empty where help
    shows none.

    A typer option's help reads its ``show_default`` text where it has one (``100, or the
    scenario's goals.p99_ms``), else its value; a plain click option's, click's help extra.
    """
    extract = getattr(param, "_extract_default_help_str", None)
    if extract is None:  # plain click
        text = str(param.get_help_extra(ctx).get("default", ""))
    else:
        value = extract(ctx=ctx)
        as_text = isinstance(param.show_default, str)
        if not (as_text or (value is not None and (param.show_default or ctx.show_default))):
            return ""
        text = param._get_default_string(ctx=ctx, show_default_is_str=as_text, default_value=value)
        if as_text:  # words, not a value: "(100, or the scenario's goals.p99_ms)"
            return cell(text.removeprefix("(").removesuffix(")"))
        if getattr(param, "secondary_opts", None):  # help names the flag without its dashes
            text = param.opts[0] if param.default else param.secondary_opts[0]
    return cell(f"`{text}`") if text else ""


def _help(text: str | None) -> str:
    return cell((text or "").replace("\\[", "[").replace("\b", ""))


def _option_names(param: Any) -> str:
    names = sorted(param.opts, key=lambda o: (not o.startswith("--"), o))
    names += list(getattr(param, "secondary_opts", ()))
    return " / ".join(f"`{n}`" for n in names)


def cli_commands() -> Any:
    """The click group of ``perfsweep`` (typer's, or click's where typer uses click)."""
    import typer.main

    from analyzer.cli import app

    return typer.main.get_command(app)


def cli_reference(group: Any = None) -> str:
    """The CLI reference page: every command of ``group`` (default: ``perfsweep``'s), its
    arguments and its visible options."""
    group = cli_commands() if group is None else group
    lines = [
        "# Command line",
        "",
        "Generated from the typer app (`analyzer.cli`) each time the site is built.",
        "Every command also prints this with `--help`.",
        "",
        "Exit codes: 0 done; 1 a goal or a gate was not met; 2 a usage or input error;",
        "3 the server under test failed; 130 interrupted.",
        "",
    ]
    for name, command in group.commands.items():
        if getattr(command, "hidden", False):
            continue
        ctx = command.context_class(command, info_name=name)
        lines += [f"## perfsweep {name}", "", rst_to_markdown(command.help or ""), ""]
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        if arguments:
            lines += ["| argument | type | required | what it is |", "|---|---|---|---|"]
            for p in arguments:
                required = "yes" if p.required else "no"
                lines.append(
                    f"| `{(p.metavar or p.name).upper()}` | {cell(_type_name(p, ctx))} | {required} "
                    f"| {_help(getattr(p, 'help', None))} |"
                )
            lines.append("")
        options = [
            p
            for p in command.params
            if p.param_type_name == "option" and not getattr(p, "hidden", False)
        ]
        lines += ["| option | type | default | what it does |", "|---|---|---|---|"]
        for p in options:
            lines.append(
                f"| {_option_names(p)} | {cell(_type_name(p, ctx))} | {_default(p, ctx)} "
                f"| {_help(p.help)} |"
            )
        lines.append("")
    return "\n".join(lines)


# -- where flags set scenario keys (read from the source) ---------------------------------------


def _names(node: ast.AST | None) -> set[str]:
    """Names a value expression reads; of a conditional expression, its two results only."""
    if node is None:
        return set()
    if isinstance(node, ast.IfExp):
        # ``x if x else None`` reads x; ``True if flag else None`` reads the test's flag.
        branches = (node.body, node.orelse)
        flags = any(isinstance(b, ast.Constant) and isinstance(b.value, bool) for b in branches)
        return _names(node.body) | _names(node.orelse) | (_names(node.test) if flags else set())
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
            found.add(f"{sub.value.id}.{sub.attr}")
    return found


def _targets(node: ast.AST) -> set[str]:
    """Names an assignment target binds (``x``, ``a, b``, ``(x if c else y)[k]``)."""
    if isinstance(node, ast.Subscript):
        return _targets(node.value)
    if isinstance(node, ast.IfExp):
        return _targets(node.body) | _targets(node.orelse)
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _flow(func: ast.FunctionDef) -> dict[str, set[str]]:
    """Each local name -> the names it was computed from, transitively (a fixpoint)."""
    edges: dict[str, set[str]] = {}
    for node in ast.walk(func):
        pairs: list[tuple[ast.AST, ast.AST | None]] = []
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            pairs = [(node.target, node.value)]
        elif isinstance(node, ast.For | ast.comprehension):
            pairs = [(node.target, node.iter)]
        for target, value in pairs:
            for name in _targets(target):
                edges.setdefault(name, set()).update(_names(value))
    changed = True
    while changed:
        changed = False
        for name, sources in edges.items():
            wider = sources.union(*(edges.get(s, set()) for s in list(sources)))
            if wider != sources:
                edges[name], changed = wider, True
    return edges


def _resolve(names: Iterable[str], flow: Mapping[str, set[str]]) -> set[str]:
    out = set(names)
    for name in list(out):
        out |= flow.get(name, set())
    return out


def _dotted_dicts(func: ast.FunctionDef) -> Iterator[tuple[str | None, ast.AST]]:
    """``(key, value)`` of every dict literal in ``func`` with dotted keys; ``(None, value)``
    for a ``**value`` entry of such a dict."""
    for node in ast.walk(func):
        if not isinstance(node, ast.Dict):
            continue
        keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
        if not any(isinstance(k, str) and _DOTTED.match(k) for k in keys) and not any(
            k is None for k in node.keys
        ):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                yield None, value
            elif (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and _DOTTED.match(key.value)
            ):
                yield key.value, value


def _functions(path: Path) -> Iterator[ast.FunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    yield from (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))


def _helpers() -> dict[str, tuple[list[str], dict[str, set[str]]]]:
    """``*_overrides`` helpers: name -> (parameter names, dotted key -> parameters it reads)."""
    helpers = {}
    for path in sorted(CONFIG_DIR.glob("*.py")):
        for func in _functions(path):
            if not func.name.endswith("_overrides"):
                continue
            params = [a.arg for a in func.args.args]
            flow = _flow(func)
            keys: dict[str, set[str]] = {}
            for key, value in _dotted_dicts(func):
                if key is not None:
                    keys[key] = _resolve(_names(value), flow) & set(params)
            helpers[func.name] = (params, keys)
    return helpers


def _keys_of(
    func: ast.FunctionDef, helpers: Mapping[str, tuple[list[str], dict[str, set[str]]]]
) -> dict[str, set[str]]:
    """Dotted key -> the names (parameters, ``obj.field``) of ``func`` its value comes from."""
    flow = _flow(func)
    calls = {
        t.id: node.value
        for node in ast.walk(func)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    keys: dict[str, set[str]] = {}
    for key, value in _dotted_dicts(func):
        if key is not None:
            keys.setdefault(key, set()).update(_resolve(_names(value), flow))
            continue
        call = calls.get(value.id) if isinstance(value, ast.Name) else value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            continue
        if call.func.id not in helpers:
            continue
        params, helper_keys = helpers[call.func.id]
        given = {params[i]: a for i, a in enumerate(call.args) if i < len(params)}
        given |= {k.arg: k.value for k in call.keywords if k.arg}
        for helper_key, reads in helper_keys.items():
            names = set().union(*(_names(given[p]) for p in reads if p in given))
            keys.setdefault(helper_key, set()).update(_resolve(names, flow))
    return keys


def _command_name(func: ast.FunctionDef) -> str | None:
    """``run`` for a function decorated ``@app.command("run")``."""
    for deco in func.decorator_list:
        if (
            isinstance(deco, ast.Call)
            and isinstance(deco.func, ast.Attribute)
            and deco.func.attr == "command"
        ):
            first = deco.args[0] if deco.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                return first.value
            return func.name
    return None


def _constructed(func: ast.FunctionDef) -> dict[str, dict[str, set[str]]]:
    """Classes a command builds from its parameters: class -> field -> the names it reads."""
    out: dict[str, dict[str, set[str]]] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            fields = {k.arg: _names(k.value) for k in node.keywords if k.arg}
            if fields:
                out.setdefault(node.func.id, {}).update(fields)
    return out


#: Per command: dotted key -> the command's parameters that set it.
KeySources = dict[str, dict[str, set[str]]]
#: Per command: class it builds -> field -> the command's parameters it is built from.
BuiltClasses = dict[str, dict[str, dict[str, set[str]]]]


def flag_sources() -> tuple[KeySources, BuiltClasses]:
    """Per command: dotted key -> the command's parameter names that set it; and per command,
    the classes it builds from its parameters (class -> field -> parameter names)."""
    helpers = _helpers()
    by_command: KeySources = {}
    built: BuiltClasses = {}
    for path in sorted(COMMANDS_DIR.glob("*.py")):
        for func in _functions(path):
            name = _command_name(func)
            if name is None:
                continue
            given = {a.arg for a in func.args.args + func.args.kwonlyargs}
            by_command[name] = {
                k: v & given for k, v in _keys_of(func, helpers).items() if v & given
            }
            built[name] = {
                cls: {f: v & given for f, v in fields.items()}
                for cls, fields in _constructed(func).items()
            }
    # A library call that builds the scenario from a request object the command filled in.
    for path in LIBRARY_SOURCES:
        for func in _functions(path):
            annotated = {
                a.arg: a.annotation.id for a in func.args.args if isinstance(a.annotation, ast.Name)
            }
            aliases = {
                t.id: node.value.id
                for node in ast.walk(func)
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
                for t in node.targets
                if isinstance(t, ast.Name) and node.value.id in annotated
            }
            keys = _keys_of(func, helpers)
            for command, classes in built.items():
                for key, names in keys.items():
                    params: set[str] = set()
                    for name in names:
                        obj, _, field = name.partition(".")
                        cls = annotated.get(aliases.get(obj, obj))
                        if field and cls in classes:
                            params |= classes[cls].get(field, set())
                    if params:
                        by_command[command].setdefault(key, set()).update(params)
    return by_command, built


def scenario_flags() -> dict[str, list[tuple[str, str]]]:
    """Dotted key -> ``(command, option)`` pairs that set it, from the source and the CLI."""
    by_command, built = flag_sources()
    group = cli_commands()
    options = {
        name: {
            p.name: max(p.opts, key=len)
            for p in command.params
            if p.param_type_name == "option" and not getattr(p, "hidden", False)
        }
        for name, command in group.commands.items()
    }
    found: dict[str, list[tuple[str, str]]] = {}
    for command, keys in by_command.items():
        for key, params in keys.items():
            for param in sorted(params):
                if param in options.get(command, {}):
                    found.setdefault(key, []).append((command, options[command][param]))
    # ``[gate]``: the gate's criteria flags (its GateFlags) override the table's keys of the
    # same name, or of the same name without its unit (``max_regression_pct``).
    from analyzer.config.sections import GateSection

    criteria: dict[str, set[str]] = built.get("gate", {}).get("GateFlags", {})
    for key in GateSection.model_fields:
        bare = next((key.removesuffix(s) for s, _ in UNITS if key.endswith(s)), key)
        for param in sorted(criteria.get(key) or criteria.get(bare) or ()):
            if param in options.get("gate", {}):
                found.setdefault(f"gate.{key}", []).append(("gate", options["gate"][param]))
    return found


# -- scenario keys --------------------------------------------------------------------------------


def field_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a class's fields (``x: int = 0`` then ``\"\"\"...\"\"\"``)."""
    body = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls))).body[0]
    docs = {}
    assert isinstance(body, ast.ClassDef)
    for node, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = rst_to_markdown(after.value.value)
    return docs


def _bound(metadata: Iterable[Any]) -> str:
    words = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    out = []
    for item in metadata:
        for attr, sign in words.items():
            value = getattr(item, attr, None)
            if value is not None:
                out.append(f"{sign} {value}")
    return ", ".join(out)


def type_text(annotation: Any) -> str:
    """A field's type in words (``number``, ``one of: rate, concurrency``, ``[int, int]``)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        inner = type_text(args[0])
        # Field(gt=0) inside Annotated carries its bounds in its own metadata.
        flat = [m for a in args[1:] for m in (*getattr(a, "metadata", ()), a)]
        return f"{inner} {_bound(flat)}".strip()
    if origin is typing.Literal:
        return "one of: " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return " or ".join(type_text(a) for a in rest)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {type_text(args[0])}"
        return "[" + ", ".join(type_text(a) for a in args) + "]"
    if origin is dict:
        return f"table: name = {type_text(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of: " + ", ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return "table (below)"
    names = {str: "text", int: "integer", float: "number", bool: "true or false", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(value: Any) -> str:
    """A default as TOML would spell it; empty when unset."""
    if value is None or value == () or value == {}:
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str | Path):
        return f'`"{value}"`' if str(value) else '`""`'
    if isinstance(value, tuple):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    return f"`{value}`"


def _field_type(field: Any) -> str:
    text = type_text(field.annotation)
    bound = _bound(field.metadata)
    return f"{text} {bound}".strip()


def _section_table(
    prefix: str, model: Any, flags: Mapping[str, list[tuple[str, str]]], env: bool
) -> list[str]:
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if hasattr(cls, "model_fields") and cls.__module__.startswith("analyzer"):
            docs |= field_docs(cls)
    lines = [
        "| key | type | default | flag | environment variable | what it sets |",
        "|---|---|---|---|---|---|",
    ]
    for key, field in model.model_fields.items():
        if hasattr(field.annotation, "model_fields"):
            continue  # a section: its own table
        dotted = f"{prefix}{key}"
        kind = _field_type(field)
        if unit := unit_of(key):
            kind = f"{kind}, {unit}"
        default = (
            "required"
            if field.is_required()
            else default_text(field.get_default(call_default_factory=True))
        )
        given = flags.get(dotted, [])
        flag = "<br>".join(
            f"`{option}` ({', '.join(c for c, o in given if o == option)})"
            for option in dict.fromkeys(o for _, o in given)
        )
        variable = f"`{env_name(dotted)}`" if env else ""
        lines.append(
            f"| `{key}` | {cell(kind)} | {default} | {flag} | {variable} "
            f"| {cell(docs.get(key, ''))} |"
        )
    return lines


def _nested(model: Any) -> Iterator[tuple[str, Any]]:
    """Fields of ``model`` that are lists of tables: (name, the table's model)."""
    for key, field in model.model_fields.items():
        args = typing.get_args(field.annotation)
        if args and hasattr(args[0], "model_fields"):
            yield key, args[0]


def scenario_reference() -> str:
    """The scenario page: every section's keys, with the flags and variables that set them."""
    from analyzer.config.scenario import Scenario

    flags = scenario_flags()
    lines = [
        "# Scenario keys",
        "",
        "Generated from the scenario's declaration (`analyzer/config/scenario.py`,",
        "`analyzer/config/sections.py`, `analyzer/config/traffic.py`) each time the site is built.",
        "",
        "A scenario is a TOML file. Three layers set each key; the later one wins:",
        "",
        "1. the file (`--scenario FILE`, or the bundled `scenarios/<model>.toml`);",
        "2. an environment variable `PERFSWEEP_<SECTION>_<KEY>`, for example",
        "   `PERFSWEEP_GOALS_P99_MS=50`;",
        "3. a flag of `perfsweep run` (or `load`, `gate`, `ui`, `predict`).",
        "",
        "An unknown key is an error that names the key. A relative path in a file is relative",
        "to that file. The flag column names the commands that take the flag.",
        "`perfsweep load` and `perfsweep ui` read no file and no environment variable.",
        "",
    ]
    top = Scenario.model_fields["objective"]
    lines += [
        "## Top level",
        "",
        "| key | type | default | flag | environment variable | what it sets |",
        "|---|---|---|---|---|---|",
        f"| `objective` | text | {default_text(top.default)} | "
        + "<br>".join(f"`{o}` ({c})" for c, o in flags.get("objective", []))
        + f" | `{env_name('objective')}` | {cell(field_docs(Scenario).get('objective', ''))} |",
        "",
        "`[[models]]` (a list of `name`, `share` or `rate_rps`, and `p99_ms`) is read as",
        "`[[traffic.classes]]`, one class per model: see",
        "[several models on one server](../how-to/several-models.md).",
        "",
    ]
    for section, field in Scenario.model_fields.items():
        model = field.annotation
        if not hasattr(model, "model_fields"):
            continue
        lines += [f"## [{section}]", "", rst_to_markdown(model.__doc__ or ""), ""]
        if section == "gate":
            lines += [
                "`perfsweep gate` reads this table from `--scenario FILE`, else from",
                "`./perfsweep.toml`. `perfsweep run` ignores it.",
                "",
            ]
        lines += _section_table(f"{section}.", model, flags, env=True)
        lines.append("")
        for key, sub in _nested(model):
            lines += [
                f"### [[{section}.{key}]]",
                "",
                rst_to_markdown(sub.__doc__ or ""),
                "",
                *_section_table(f"{section}.{key}[].", sub, {}, env=False),
                "",
            ]
    return "\n".join(lines)


# -- the mkdocs hook ----------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference pages to the site (mkdocs ``on_files`` event)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "reference/cli.md", content=cli_reference()))
    files.append(File.generated(config, "reference/scenario.md", content=scenario_reference()))
    return files
