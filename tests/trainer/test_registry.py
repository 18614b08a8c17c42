"""The algorithm registry is the one source of the CLI options, the config validation and the docs' table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from neurofed.cli import app
from neurofed.trainer.fl.strategies import ALGORITHMS, PARAMS, docs_tables, get_strategy

DOCS = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def test_docs_table_is_the_generated_one():
    text = DOCS.read_text()
    block = re.search(r"<!-- algorithms:begin -->\n(.*?)\n<!-- algorithms:end -->", text, re.S)
    assert block and block.group(1).strip() == docs_tables().strip(), "run `neurofed algorithms --markdown`"


def test_every_parameter_is_a_simulate_option():
    res = CliRunner().invoke(app, ["simulate", "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0
    for p in PARAMS.values():
        assert (p.flag or "--" + p.name.replace("_", "-")).split("/")[0] in res.output, p.name
    for name in ALGORITHMS:
        assert name in res.output


def test_overrides_compose_and_are_validated():
    st = get_strategy("fedavg", sam_rho=0.1, prox_mu=1.0)
    assert [type(c).__name__ for c in st.components] == ["Prox", "SAM", "Robust"]  # Robust: default clipping
    assert get_strategy("fedbs", sam_rho=0.0, clip_mult=0).components == ()
    assert get_strategy("safe").to_dict()["fat_eps"] == 0.03
    with pytest.raises(ValueError, match="unknown strategy parameter 'sam_roh'"):
        get_strategy("fedbs", sam_roh=0.1)
    with pytest.raises(ValueError, match="sam_rho must be >= 0"):
        get_strategy("fedbs", sam_rho=-1)
    with pytest.raises(ValueError, match="bn_mode must be one of"):
        get_strategy("fedavg", bn_mode="weird")
    with pytest.raises(ValueError, match="unknown algorithm"):
        get_strategy("fedsgd")


def test_federation_config_and_wire_specs_come_from_the_strategy():
    from neurofed.broker.config import ConfigError, config_from_dict
    from neurofed.trainer.models import build_model

    cfg = config_from_dict({"federation": {"strategy": "scaffold", "aggregation": "streaming"}})
    m = build_model("eegnet", 21, 2, 320, 80.0, "standard")
    specs = cfg.strategy().upload_specs(m)
    assert set(specs) == {f"scaffold_dc.{n}" for n, _ in m.named_parameters()}
    assert get_strategy("fedavg").upload_specs(m) == {}
    with pytest.raises(ConfigError, match="unknown strategy parameter"):
        config_from_dict({"federation": {"strategy": "fedbs", "strategy_overrides": {"rho": 0.1}}})


def test_dropout_is_a_model_argument_the_strategy_carries():
    """``--dropout`` reaches every builder through Strategy.model_kwargs (simulation, coordinator, edge, checkpoint)."""
    from torch import nn

    from neurofed.trainer.models import build_model

    assert get_strategy("safe").model_kwargs("eegnet") == {}  # -1: the model's own, nothing recorded
    kw = get_strategy("safe", dropout=0.25).model_kwargs("eegnet_crop")
    assert kw == {"dropout": 0.25}
    net = build_model("eegnet_crop", 21, 2, 320, 80.0, **kw)
    assert {m.p for m in net.modules() if isinstance(m, nn.Dropout)} == {0.25}
    assert {m.p for m in build_model("eegnet", 21, 2, 320, 80.0).modules() if isinstance(m, nn.Dropout)} == {0.5}
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        get_strategy("safe", dropout=1.0).model_kwargs("eegnet")
    with pytest.raises(ValueError, match="deep models"):
        get_strategy("fed-csp-lda", dropout=0.2).model_kwargs("csp_lda")
