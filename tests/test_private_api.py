"""Every private name of another library that the package uses, listed, and checked against the installed versions.

A private name (``_parse_ckpt_path``, ...) may change in any release, and no version range says
when. The list below is the fence: the test fails, naming the name and the installed version, when one disappears
or a method's parameters change, and when the package starts to use a private name that is not listed.
"""

import ast
import importlib
import importlib.metadata
import inspect
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "project"

# (where it lives, the name, the method's parameters, or None for an attribute or a class), and where it is used.
# fmt: off
PRIVATE = [
    # >>> lr_find
    ("lightning.pytorch.utilities.exceptions", "_TunerExitException", None),  # lr_find/report.py: train_after false
    # <<< lr_find
    ("lightning.fabric.utilities.distributed", "_init_dist_connection",  # [elastic]
     ["cluster_environment", "torch_distributed_backend", "global_rank", "world_size", "kwargs"]),  # [elastic]
    ("lightning.pytorch.strategies:DDPStrategy", "_get_process_group_backend", ["self"]),  # [elastic]
    ("lightning.pytorch.strategies:DDPStrategy", "_process_group_backend", None),  # [elastic]
    ("lightning.pytorch.strategies:DDPStrategy", "_timeout", None),  # [elastic]
    # >>> serve
    # LitServe's: all in project/serve/litserve_workarounds.py, applied to the versions it names only.
    ("litserve:LitServer", "_start_server",  # [serve]
     ["self", "port", "num_uvicorn_servers", "log_level", "sockets", "uvicorn_worker_type", "kwargs"]),  # [serve]
    ("litserve:LitServer", "_init_manager", ["self", "num_api_servers"]),  # [serve]
    ("litserve:LitServer", "_transport", None),  # [serve]
    ("litserve.transport.zmq_queue:Producer", "_socket", None),  # [serve]
    ("litserve.transport.zmq_queue:Producer", "_context", None),  # [serve]
    # <<< serve
    ("lightning.pytorch.loggers:WandbLogger", "_wandb_init", None),  # [track]
    ("lightning.pytorch.loggers:WandbLogger", "_save_dir", None),  # [track]
    ("lightning.pytorch.loggers:WandbLogger", "_name", None),  # [track]
    ("lightning.pytorch.loggers:WandbLogger", "_experiment", None),  # [track]
]
# fmt: on
DOCUMENTED = {"_exit"}  # os._exit: underscored, but public and documented

# Why each name has no public route: the upstream thread. Checked on lightning 2.6.6, torch 2.14.1 and Python 3.11
# (argparse); a feature's names on the versions its module names.
LITSERVE_751 = "Lightning-AI/LitServe#751 (serve/litserve_workarounds.py)"  # [serve]
# fmt: off
WHY = {
    # >>> lr_find
    # How a tuner callback ends fit without training and without a traceback: Lightning's own BatchSizeFinder and
    # LearningRateFinder raise it (Lightning-AI/pytorch-lightning#11089); Trainer.should_stop still runs a sanity
    # validation and the fit hooks.
    "_TunerExitException": "Lightning-AI/pytorch-lightning#11089",
    # <<< lr_find
    "_init_dist_connection": "no public route: elastic/strategy.py, the process group after a restart",  # [elastic]
    "_get_process_group_backend": "no public route: elastic/strategy.py, as DDPStrategy does",  # [elastic]
    "_process_group_backend": "no public route: elastic/strategy.py, as DDPStrategy does",  # [elastic]
    "_timeout": "no public route: elastic/strategy.py, the configured DDP timeout",  # [elastic]
    # >>> serve
    "_start_server": "no public route: serve/litserve_workarounds.py (a socket per HTTP server)",
    "_init_manager": LITSERVE_751,
    "_transport": LITSERVE_751,
    "_socket": LITSERVE_751,
    "_context": LITSERVE_751,
    # <<< serve
    "_wandb_init": "no public route: track/wandb.py puts an offline run in the run's folder",  # [track]
    "_save_dir": "no public route: track/wandb.py puts an offline run in the run's folder",  # [track]
    "_name": "no public route: track/wandb.py names the run after the run's folder",  # [track]
    "_experiment": "no public route: track/wandb.py, whether the run has started",  # [track]
}
# fmt: on


def owner(where: str) -> object:
    module, _, attribute = where.partition(":")
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


def top(where: str) -> str:
    """The top-level package of ``module.path:Class``."""
    return where.split(":")[0].split(".")[0]


def version(where: str) -> str:
    distribution = {"argparse": "python"}.get(top(where), top(where))
    try:
        return f"{distribution} {importlib.metadata.version(distribution)}"
    except importlib.metadata.PackageNotFoundError:
        return distribution


def uses(name: str) -> list[str]:
    """The places in the package's source that use ``name``."""
    return [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(rf"(?<!\w){re.escape(name)}\b", line)
    ]


@pytest.mark.parametrize(("where", "name", "parameters"), PRIVATE, ids=lambda v: v if isinstance(v, str) else None)
def test_each_private_name_is_still_there_with_the_same_parameters(where, name, parameters):
    library = top(where)
    pytest.importorskip(library)
    target = owner(where)
    assert uses(name), f"{name} is listed but the package no longer uses it: take it off the list"
    if parameters is not None:
        found = getattr(target, name, None)
        assert callable(found), f"{where}.{name} is gone in {version(where)} (used at {uses(name)})"
        got = list(inspect.signature(found).parameters)
        assert got == parameters, f"{where}.{name} takes {got} in {version(where)}, not {parameters}: see {uses(name)}"
        return
    if inspect.ismodule(target):
        assert hasattr(target, name), f"{where}.{name} is gone in {version(where)} (used at {uses(name)})"
        return
    # An attribute set on instances: the class (or a base) still names it in its source.
    sources = [inspect.getsource(cls) for cls in inspect.getmro(target) if cls.__module__.split(".")[0] == library]
    assert any(f".{name}" in source for source in sources), (
        f"{where} no longer has the attribute {name} in {version(where)} (used at {uses(name)})"
    )


def private_names_used() -> set[str]:
    """Private names of other libraries in the package: imported, reached through super(), or on another object."""
    own: set[str] = set()  # names the package defines or assigns itself
    used: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
                own.add(node.name)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] != PACKAGE.name:
                used |= {a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")}
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.ctx, ast.Store):
                    own.add(node.attr)
                used.add(node.attr)
    # A library attribute the package assigns (``_save_dir``) counts as its own here: the
    # list above names those by hand. A method the package defines over a library's private one is the library's.
    return (used - own) | overridden_private_methods()


def overridden_private_methods(package: Path = PACKAGE) -> set[str]:
    """The private methods of other libraries that a class of ``package`` overrides (``def _get_help_string``)."""
    found: set[str] = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        classes = {
            node.name: {f.name for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("_")}
            for node in tree.body
            if isinstance(node, ast.ClassDef)
        }
        classes = {name: {m for m in methods if not m.startswith("__")} for name, methods in classes.items()}
        if not any(classes.values()):
            continue
        module = importlib.import_module(".".join(path.relative_to(package.parent).with_suffix("").parts))
        for name, methods in classes.items():
            for base in getattr(module, name).__mro__[1:]:
                if base.__module__.split(".")[0] != package.name:
                    found |= methods & set(vars(base))
    return found


def test_the_fence_catches_an_overridden_private_method(tmp_path, monkeypatch):
    """A class that overrides another library's private method uses it, though it never names it in a call."""
    package = tmp_path / "fenced_example"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "formatter.py").write_text(
        "import argparse\n\n\nclass Help(argparse.HelpFormatter):\n"
        "    def _get_help_string(self, action):\n        return ''\n\n    def _own(self):\n        return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert overridden_private_methods(package) == {"_get_help_string"}  # not _own: argparse has no such method


def test_every_private_name_the_package_uses_is_on_the_list():
    listed = {name for _, name, _ in PRIVATE}
    unlisted = private_names_used() - listed - DOCUMENTED
    assert not unlisted, f"private names used but not fenced in this file's list: {sorted(unlisted)} at " + str(
        {name: uses(name) for name in sorted(unlisted)}
    )


def test_each_private_name_says_why_it_has_no_public_route():
    """A fence without a reason is a name nobody can ever remove: each one names its upstream thread or says that no
    public route exists (WHY above)."""
    listed = {name for _, name, _ in PRIVATE}
    unlisted, unused = sorted(listed - set(WHY)), sorted(set(WHY) - listed)
    assert not unlisted and not unused, f"without a reason: {unlisted}; a reason for no listed name: {unused}"
    for name, why in WHY.items():
        assert re.search(r"[\w-]+/[\w-]+#\d+", why) or why.startswith("no public route"), f"{name}: {why}"
