"""The installed pytest plug-in (entry point ``pytest11``): ``--backend-file PATH`` from any
directory, with PATH anywhere on disk.

pytest fixes its rootdir and configuration file from the command line's paths before any plug-in
loads, so outside the project ``pytest --benchmark-only --backend-file /tmp/p/mine.py`` would take
the plug-in file for a test path, root the run in /tmp/p and never load the project's options
(they come from conftest.py's ``pytest_plugins``). When ``--backend-file`` is on the command line
and no other project's pytest configuration (or conftest.py where pytest runs) governs the run,
this plug-in, before the initial conftests load:

- takes the project's configuration (its pyproject.toml: rootdir, addopts, filterwarnings; and
  pytest-benchmark's storage, .benchmarks/ in the project);
- loads the project's plug-ins (harness.plugin, harness.bench) under the names conftest.py's
  ``pytest_plugins`` uses, so they are registered once, whichever comes first;
- finds the project's paths named relative to it (``harness``, ``benchmarks/test_bench.py``) that
  do not exist where pytest runs, and with no test path given runs the checks (harness/), or with
  ``--benchmark-only`` the benchmarks (benchmarks/); in the project's directory, its testpaths.

Otherwise it does nothing: one hook that returns at once, and no import beyond pytest's own.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OPTION = "--backend-file"
PLUGINS = ("harness.plugin", "harness.bench")  # as conftest.py's pytest_plugins names them
PROJECT_DIRS = ("harness", "benchmarks", "tests")


def wanted(args) -> bool:
    return any(a == OPTION or a.startswith(OPTION + "=") for a in args)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    if not wanted(args):
        return
    ini = ROOT / "pyproject.toml"
    here = Path(early_config.invocation_params.dir)
    if early_config.inipath not in (None, ini) or (early_config.inipath is None and here != ROOT
                                                   and (here / "conftest.py").is_file()):
        return  # another project's configuration or conftest governs this run: not ours to change
    if not (ini.is_file() and (ROOT / "conftest.py").is_file() and (ROOT / "harness").is_dir()):
        raise pytest.UsageError(f"{OPTION} runs normdiff's checks from its source tree, not found at {ROOT}: "
                                f"install the project editable (pip install -e) from its checkout")
    if early_config.inipath is None:
        _take_configuration(early_config, args)
    for name in PLUGINS:
        early_config.pluginmanager.import_plugin(name)
    _project_paths(early_config, parser, args)
    confcutdir = early_config.known_args_namespace.confcutdir
    early_config.known_args_namespace = parser.parse_known_args(args, namespace=copy.copy(early_config.option))
    early_config.known_args_namespace.confcutdir = confcutdir or str(ROOT)


def _take_configuration(config, args) -> None:
    """Make the project's pyproject.toml this run's configuration file, as if pytest had been
    started in the project's directory: rootdir, ini values, addopts, benchmark storage."""
    from _pytest.config.findpaths import locate_config

    rootpath, inipath, inicfg = locate_config(ROOT, [ROOT])[:3]
    config._rootpath, config._inipath, config._inicfg = rootpath, inipath, inicfg  # noqa: SLF001
    config._inicache.clear()  # noqa: SLF001
    config._parser.extra_info.update(rootdir=str(rootpath), inifile=str(inipath))  # noqa: SLF001
    # pytest-benchmark's storage is relative to the working directory: the project's, as there
    addopts = list(config.getini("addopts")) + [f"--benchmark-storage=file://{rootpath / '.benchmarks'}"]
    args[:0] = addopts
    config.pluginmanager.consider_preparse(addopts, exclude_only=False)  # -p no:cacheprovider
    config.known_args_namespace.confcutdir = str(rootpath)


def _project_paths(config, parser, args) -> None:
    """Resolve test paths named relative to the project that do not exist here; with none given
    (outside the project's directory), the checks or the benchmarks."""
    here = Path(config.invocation_params.dir)
    # Only what pytest takes for a test path is probed: an option's value (-k, --backend) may be
    # any text, however long.
    positional = set(parser.parse_known_args(args, namespace=copy.copy(config.option)).file_or_dir)
    marked = [f"{a}\0{i}" if a in positional and _project_path(here, a) else a for i, a in enumerate(args)]
    ns = parser.parse_known_args(marked, namespace=copy.copy(config.option))
    for given in ns.file_or_dir:
        if "\0" in given and not ns.pyargs:
            path, index = given.rsplit("\0", 1)
            args[int(index)] = str(ROOT / path)
    if not ns.file_or_dir and here != ROOT:
        args.append(str(ROOT / ("benchmarks" if getattr(ns, "benchmark_only", False) else "harness")))


def _project_path(here: Path, arg: str) -> bool:
    """Whether ``arg`` names a path of the project that does not exist here. Text the system
    cannot take for a path (too long, a component over the file-name limit) is not one: pytest's
    own parsing then says what it is."""
    path = arg.split("::", 1)[0]
    if arg.startswith("-") or not path:
        return False
    try:
        if Path(path).is_absolute() or (here / path).exists():
            return False
        return Path(path).parts[0] in PROJECT_DIRS and (ROOT / path).exists()
    except (OSError, ValueError):
        return False
