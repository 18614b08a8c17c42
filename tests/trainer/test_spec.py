"""The schema of ``neurofed simulate``'s options (grid spec lines), independent of typer."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from neurofed.trainer.experiments.spec import SimOptions, SpecError, parse_line, parse_options
from neurofed.trainer.fl.strategies import PARAMS

ROOT = Path(__file__).resolve().parents[2]


def test_schema_is_simulate_options_with_its_defaults():
    """One field per ``neurofed simulate`` option (strategy parameters included), with the command's defaults."""
    from neurofed.trainer.cli import simulate
    from neurofed.trainer.options import with_strategy_options

    params = inspect.signature(with_strategy_options(simulate)).parameters
    fields = SimOptions.model_fields
    assert set(params) == set(fields)
    for name, p in params.items():
        assert fields[name].default == p.default, name
    assert set(PARAMS) <= set(fields)


def test_switches_values_and_last_one_wins():
    o = parse_line("--rounds 3 --rounds=5 --no-ea --save-models --shared-bn --scaffold --attack fgsm:0.03")
    assert (o.rounds, o.ea, o.save_models, o.local_bn, o.scaffold, o.attack) == (5, False, True, False, True,
                                                                                   "fgsm:0.03")


@pytest.mark.parametrize("line, message", [
    ("--roundz 3", "no such option: --roundz"),
    ("--rounds x", "--rounds 'x': "),
    ("--rounds", "option --rounds requires an argument"),
    ("stray", "unexpected argument 'stray'"),
    ("--lr 'unclosed", "cannot split the options"),
])
def test_bad_lines_give_one_line_errors(line, message):
    with pytest.raises(SpecError) as exc:
        parse_line(line)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_bad_values_name_the_option(data_dir):
    with pytest.raises(SpecError, match=r"Invalid value for --preset: unknown preset"):
        parse_line(f"--preset nope --data-dir {data_dir}").to_sim_config()
    with pytest.raises(SpecError, match=r"--seeds 'a': expected comma-separated integers"):
        parse_line(f"--seeds a --data-dir {data_dir}").to_sim_config()


def test_every_committed_spec_parses():
    """studies/*/spec.toml keep their syntax: every run's options are valid under the schema."""
    from neurofed.trainer.experiments.grid import spec_entries

    specs = sorted((ROOT / "studies").glob("*/spec.toml"))
    assert specs
    for spec in specs:
        entries = spec_entries(spec)
        assert entries, spec
        for *_, values, where in entries:
            try:
                parse_options(values)  # raises naming the problem
            except SpecError as exc:
                raise AssertionError(f"{where}: {exc}") from None
