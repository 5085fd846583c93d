"""Named regimes: the files of conf/routing/ (the `routing=<name>` option's choices) and any
regime file by path (docs/routing-regimes.md)."""

from __future__ import annotations

from pathlib import Path

from harness.common.errors import HarnessError
from harness.routing.params import RegimeFile, RoutingRegime

CONF_ROUTING = Path(__file__).resolve().parents[2] / "conf" / "routing"
RECORDED = "recorded"  # the option that generates nothing: the model's own (recorded or imported) routing
ANCHOR = "anchor"  # the option that replays each model's fitted regime, conf/routing/<model>_fit.yaml


def named_regimes() -> list[str]:
    return sorted(p.stem for p in CONF_ROUTING.glob("*.yaml") if p.stem not in (RECORDED, ANCHOR))


def regime_file(name_or_path: str) -> RegimeFile:
    """A regime file by path, or by its name in conf/routing/."""
    path = Path(name_or_path)
    if path.is_file():
        return RegimeFile.load(path)
    named = CONF_ROUTING / f"{name_or_path}.yaml"
    if named.is_file() and name_or_path != RECORDED:
        return RegimeFile.load(named)
    raise HarnessError(f"regime={name_or_path!r} is neither a regime file nor a name of conf/routing/ "
                       f"({', '.join(named_regimes())}); write one with python -m harness.routing fit")


def anchor_of(model: str) -> RegimeFile:
    """The model's fitted regime (conf/routing/<model>_fit.yaml), or the generator's defaults
    when none was fitted (named <model>_default)."""
    path = CONF_ROUTING / f"{model}_fit.yaml"
    return RegimeFile.load(path) if path.is_file() else RegimeFile(RoutingRegime(), None, {}, f"{model}_default")
