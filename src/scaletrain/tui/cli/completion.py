"""`scaletrain completion bash|zsh|fish`: a shell completion script generated from the parser itself.

The parser is walked once (`command_specs`): every command and sub-command, its flags, which flags take a value,
the choices of those that have choices, the preset names and catalog model ids for --preset / --model / --resident,
`--gpus` spellings, and file completion for the flags and positionals that name files or folders. The three scripts
are written from that walk, so a new flag or choice is completed without touching this module.

    eval "$(scaletrain completion bash)"                       # ~/.bashrc
    source <(scaletrain completion zsh)                       # ~/.zshrc (the bash function, via bashcompinit)
    scaletrain completion fish > ~/.config/fish/completions/scaletrain.fish
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

SHELLS = ("bash", "zsh", "fish")
FUNCTION = "_scaletrain"
# Values that name files or folders (flags by dest, positionals by dest): the shell's own file completion.
FILE_DESTS = frozenset({"data", "eval_data", "weights", "run_dir", "replay", "plan", "out", "script", "logs"})
GPU_COUNTS = (1, 2, 4, 8)
_WORD = re.compile(r"^[A-Za-z0-9._:/+@=-]+$")          # a value the scripts may hold unquoted


def configure_completion(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=SHELLS, help="the shell to print the script for (required)")
    p.epilog = ('bash: eval "$(scaletrain completion bash)" in ~/.bashrc\n'
                "zsh:  source <(scaletrain completion zsh) in ~/.zshrc\n"
                "fish: scaletrain completion fish > ~/.config/fish/completions/scaletrain.fish")


def print_completion(shell: str, parser: argparse.ArgumentParser) -> int:
    """`scaletrain completion SHELL` (parser.py hands over the whole parser)."""
    print(completion_script(shell, parser), end="")
    return 0


@dataclass(frozen=True)
class OptionSpec:
    flags: tuple[str, ...]
    help: str
    takes_value: bool
    values: tuple[str, ...] = ()          # choices, or names the value may be (presets, model ids)
    files: bool = False


@dataclass
class CommandSpec:
    path: tuple[str, ...]                                  # () top level, ("plan",), ("config", "write")
    options: list[OptionSpec] = field(default_factory=list)
    subcommands: list[tuple[str, str]] = field(default_factory=list)   # (name, help)
    positional_values: tuple[str, ...] = ()
    positional_files: bool = False

    @property
    def name(self) -> str:
        return " ".join(self.path)


def dynamic_values() -> dict[str, tuple[str, ...]]:
    """Values a flag's value may be beyond its argparse choices: presets, catalog ids, --gpus spellings."""
    from scaletrain.engine.catalog.architectures import catalog_ids
    from scaletrain.engine.catalog.hardware import GPU_CATALOG
    from scaletrain.engine.request.presets import list_presets

    models = tuple(catalog_ids())
    gpus = ("auto", *(f"{n}x{g.key}" for g in GPU_CATALOG for n in GPU_COUNTS), "2xCPU")
    return {"preset": tuple(p.name for p in list_presets()), "model": models, "resident": models, "gpus": gpus}


def _option(action: argparse.Action, dynamic: dict[str, tuple[str, ...]]) -> OptionSpec:
    takes = action.nargs != 0
    values = tuple(str(c) for c in action.choices) if action.choices else dynamic.get(action.dest, ())
    help_text = " ".join((action.help or "").split()) if action.help != argparse.SUPPRESS else ""
    return OptionSpec(tuple(action.option_strings), help_text, takes,
                      tuple(v for v in values if _WORD.match(v)), takes and action.dest in FILE_DESTS)


def command_specs(parser: argparse.ArgumentParser, path: tuple[str, ...] = (),
                  dynamic: dict[str, tuple[str, ...]] | None = None) -> list[CommandSpec]:
    """Every command of `parser` (itself first), walked through its sub-parsers."""
    dyn = dynamic_values() if dynamic is None else dynamic
    spec = CommandSpec(path)
    out = [spec]
    for action in parser._actions:                        # argparse has no public walk of its actions
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                spec.subcommands.append((name, helps.get(name, "")))
                out += command_specs(sub, (*path, name), dyn)
        elif action.option_strings:
            spec.options.append(_option(action, dyn))
        elif action.choices:
            spec.positional_values = tuple(str(c) for c in action.choices)
        else:
            spec.positional_files = spec.positional_files or action.dest in FILE_DESTS
    return out


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    specs = command_specs(parser)
    if shell == "bash":
        return bash_script(specs)
    if shell == "zsh":
        return zsh_script(specs)
    return fish_script(specs)


# ---- bash (zsh runs the same function through bashcompinit) ---------------------------------------------------
def _words(values: object) -> str:
    return " ".join(str(v) for v in values)      # type: ignore[attr-defined]


def _value_cases(specs: list[CommandSpec]) -> list[str]:
    """`case "$cmd|$prev"` arms: a flag's values, file completion, or nothing (a number, free text)."""
    by_flag: dict[str, set[tuple[str, tuple[str, ...], bool]]] = {}
    for s in specs:
        for o in s.options:
            if o.takes_value:
                for f in o.flags:
                    by_flag.setdefault(f, set()).add((s.name, o.values, o.files))
    arms = []
    for flag, seen in sorted(by_flag.items()):
        kinds = {(v, files) for _, v, files in seen}
        keyed = [("*", next(iter(kinds)))] if len(kinds) == 1 else [(name, (v, files)) for name, v, files in seen]
        for name, (values, files) in sorted(keyed):
            pattern = f'*"|{flag}"' if name == "*" else f'"{name}|{flag}"'
            if values:
                arms.append(f'        {pattern}) COMPREPLY=($(compgen -W "{_words(values)}" -- "$cur")); return 0 ;;')
            elif files:
                arms.append(f'        {pattern}) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;')
            else:
                arms.append(f"        {pattern}) return 0 ;;")
    return arms


def bash_script(specs: list[CommandSpec]) -> str:
    value_flags = sorted({f for s in specs for o in s.options if o.takes_value for f in o.flags})
    sub_arms = [f'                "{" ".join(s.path[:-1])}|{s.path[-1]}") cmd="{s.name}" ;;' for s in specs if s.path]
    opt_arms = [f'        "{s.name}") opts="{_words(f for o in s.options for f in o.flags)}" ;;' for s in specs]
    word_arms = []
    for s in specs:
        if s.subcommands or s.positional_values:
            words = _words([n for n, _ in s.subcommands] + list(s.positional_values))
            word_arms.append(f'        "{s.name}") COMPREPLY=($(compgen -W "{words}" -- "$cur")) ;;')
        elif s.positional_files:
            word_arms.append(f'        "{s.name}") COMPREPLY=($(compgen -f -- "$cur")) ;;')
    lines = [
        "# bash completion for scaletrain, generated from its parser by `scaletrain completion bash`",
        f"{FUNCTION}() {{",
        "    local cur prev cmd w i skip=0 opts=\"\"",
        "    COMPREPLY=()",
        '    cur="${COMP_WORDS[COMP_CWORD]}"',
        '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    cmd=""',
        "    for ((i=1; i<COMP_CWORD; i++)); do",
        '        w="${COMP_WORDS[i]}"',
        "        if [[ $skip == 1 ]]; then skip=0; continue; fi",
        '        case "$w" in',
        f"            {'|'.join(value_flags)}) skip=1 ;;",
        "            -*) ;;",
        '            *) case "$cmd|$w" in',
        *sub_arms,
        "               esac ;;",
        "        esac",
        "    done",
        '    case "$cmd|$prev" in',
        *_value_cases(specs),
        "    esac",
        '    if [[ "$cur" == -* ]]; then',
        '        case "$cmd" in',
        *opt_arms,
        "        esac",
        '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        "        return 0",
        "    fi",
        '    case "$cmd" in',
        *word_arms,
        "    esac",
        "    return 0",
        "}",
        f"complete -o filenames -F {FUNCTION} scaletrain",
    ]
    return "\n".join(lines) + "\n"


def zsh_script(specs: list[CommandSpec]) -> str:
    return ("# zsh completion for scaletrain, generated by `scaletrain completion zsh`: the bash completion through "
            "zsh's bashcompinit\n# use: source <(scaletrain completion zsh) in ~/.zshrc\n"
            "if ! (( $+functions[compdef] )); then autoload -U +X compinit && compinit; fi\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + bash_script(specs))


# ---- fish ---------------------------------------------------------------------------------------------------------
def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_condition(spec: CommandSpec) -> str:
    if not spec.path:
        return "__fish_use_subcommand"
    if len(spec.path) == 1:
        return f"__fish_seen_subcommand_from {spec.path[0]}"
    return " ; and ".join(f"__fish_seen_subcommand_from {p}" for p in spec.path)


def fish_script(specs: list[CommandSpec]) -> str:
    lines = ["# fish completion for scaletrain, generated from its parser by `scaletrain completion fish`",
             "complete -c scaletrain -f"]
    for s in specs:
        cond = _fish_condition(s)
        for name, help_text in s.subcommands:
            lines.append(f"complete -c scaletrain -n {_fish_quote(cond)} -a {name} -d {_fish_quote(help_text[:80])}")
        if s.positional_values:
            lines.append(f"complete -c scaletrain -n {_fish_quote(cond)} -a {_fish_quote(_words(s.positional_values))}")
        if s.positional_files:
            lines.append(f"complete -c scaletrain -n {_fish_quote(cond)} -F")
        for o in s.options:
            names = " ".join(f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}" for f in o.flags)
            arg = ""
            if o.values:
                arg = f" -x -a {_fish_quote(_words(o.values))}"
            elif o.files:
                arg = " -r -F"
            elif o.takes_value:
                arg = " -x"
            lines.append(f"complete -c scaletrain -n {_fish_quote(cond)} {names}{arg} -d {_fish_quote(o.help[:80])}")
    return "\n".join(lines) + "\n"

