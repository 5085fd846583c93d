"""One argument style for every command (docs/python-api.md "The commands"): key=value,
--help that writes nothing, and a mistyped key, value or group option answered in one line
with the closest right one."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli.overrides import compose_with_hints
from harness.common.errors import HarnessError
from harness.job import mlflow_log
from harness.job.config import register_configs
from harness.report import tables
from harness.results import schema


def test_schema_help_prints_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    page = tmp_path / "result-schema.md"
    monkeypatch.setattr(schema, "PAGE", page)
    for ask in (["--help"], ["-h"]):
        assert schema.main(ask) == 0
        assert "write" in capsys.readouterr().out and not page.exists()
    assert schema.main([]) == 2 and not page.exists()  # nothing asked: nothing written
    assert "say what to do: write" in capsys.readouterr().err
    assert schema.main(["wrte"]) == 2 and not page.exists()
    assert "did you mean write?" in capsys.readouterr().err
    assert schema.main(["--check"]) == 1 and not page.exists()
    assert schema.main(["write"]) == 0 and page.read_text() == schema.render()
    assert schema.main(["--check"]) == 0


def test_a_group_option_in_other_letters_gets_did_you_mean() -> None:
    register_configs()
    with pytest.raises(HarnessError, match=r"budget=10gb is not an option .*; did you mean 10GB\?"):
        compose_with_hints(["budget=10gb"])
    with pytest.raises(HarnessError, match=r"use budget=custom budget\.gpu_gb=12"):
        compose_with_hints(["budget=12gb"])  # a size with no option of its own: the custom budget


@pytest.mark.parametrize(("argv", "expected"), [
    (["ruun=outputs"], "unknown argument 'ruun=outputs'; did you mean runs?"),
    (["errors=cl"], "invalid choice: 'cl' (choose from 'ci', 'sd'); did you mean ci?"),
    (["--errors", "SD"], "did you mean sd?"),
])
def test_the_report_answers_a_typo_with_the_closest_option(argv: list[str], expected: str,
                                                           capsys: pytest.CaptureFixture) -> None:
    assert tables.main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("argv", "expected"), [
    (["push", "uir=sqlite:///x.db"], "unknown argument 'uir=sqlite:///x.db'; did you mean uri?"),
    (["psh"], "invalid choice: 'psh' (choose from 'push'); did you mean push?"),
])
def test_track_answers_a_typo_with_the_closest_option(argv: list[str], expected: str,
                                                      capsys: pytest.CaptureFixture) -> None:
    assert mlflow_log.main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1
