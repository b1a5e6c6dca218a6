"""Write requirements.lock: the exact versions of this environment that the project and its extras need.

    pip install -e ".[dev]" && pytest && python scripts/lock.py

Each package needed only by a feature's extras ends in ``# [<feature>]`` (by several: ``# [<feature> <feature>]``; an
extra's feature is the marker of its line in ``dev``, ``"project[<extra>]",  # [<feature>]``, else its own name): the
template's copies keep those lines only with the feature (template/finish.py), and pip reads them as comments.
"""

import re
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(requirements: list[str]) -> dict[str, str]:
    """Every installed distribution the requirements pull in, with their dependencies: {name: version}."""
    found: dict[str, str] = {}
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        try:
            dist = distribution(requirement.name)
        except PackageNotFoundError:
            continue  # not for this platform or Python (an environment marker said so)
        name = canonical(dist.metadata["Name"])
        todo += [(Requirement(r), e) for e in requirement.extras for r in dist.requires or []]
        if name in found:
            continue
        found[name] = dist.version
        todo += [(Requirement(r), "") for r in dist.requires or []]
    return found


def requirements(project: str, extra: str | None) -> list[str]:
    """The installed project's requirements (its metadata, as pip read pyproject.toml): the core's, or an extra's."""
    found = []
    for line in distribution(project).requires or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if (extra is None and marker is None) or (extra and marker and marker.evaluate({"extra": extra})):
            requirement.marker = None
            found.append(str(requirement))
    return found


def main() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    own = canonical(re.search(r'^name = "([^"]+)"$', pyproject, flags=re.M).group(1))
    # The feature each extra belongs to, from dev's marked lines: `"project[<extra>]",  # [<feature>]`.
    feature_of = dict(re.findall(r'^\s*"[\w-]+\[([\w-]+)\]",\s*#\s*\[([a-z]+)\]\s*$', pyproject, flags=re.M))
    extras = {"dev": requirements(own, "dev")}
    dev = [r for r in extras["dev"] if canonical(Requirement(r).name) != own]
    features = [e for r in extras["dev"] if canonical(Requirement(r).name) == own for e in Requirement(r).extras]
    extras |= {feature: requirements(own, feature) for feature in features}
    core = closure(requirements(own, None) + dev)
    needed_by: dict[str, list[str]] = {}
    versions = dict(core)
    for feature in features:
        for name, version in closure(extras[feature]).items():
            versions[name] = version
            owner = feature_of.get(feature, feature)
            if name not in core and owner not in needed_by.setdefault(name, []):
                needed_by[name].append(owner)
    lines = [
        "# Exact versions the test suite passed with (Python 3.11, Linux x86_64), beside the ranges in pyproject.toml.",
        "# Install: pip install -r requirements.lock && pip install --no-deps -e .   (or: make install-locked)",
        "# Written by scripts/lock.py; a package only a feature's extra needs is marked with the feature.",
    ]
    for name in sorted(versions):
        marks = f"  # [{' '.join(sorted(needed_by[name]))}]" if name in needed_by else ""
        lines.append(f"{name}=={versions[name]}{marks}")
    (ROOT / "requirements.lock").write_text("\n".join(lines) + "\n")
    print(f"wrote requirements.lock: {len(versions)} packages, {len(needed_by)} of them for a feature only")


if __name__ == "__main__":
    main()
