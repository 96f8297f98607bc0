"""Old module paths keep working for a release: the same module object, with a deprecation warning."""

import importlib
import sys

import pytest
import torch

from anatomy.deprecation import AnatomyDeprecationWarning
from anatomy.moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_new_module_with_a_warning(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(AnatomyDeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_from_import_gives_the_same_objects(monkeypatch):
    monkeypatch.delitem(sys.modules, "anatomy.tokenizer", raising=False)
    with pytest.warns(AnatomyDeprecationWarning):
        from anatomy.tokenizer import Tokenizer
    from anatomy.text.tokenizer import Tokenizer as moved

    assert Tokenizer is moved


def test_the_warning_points_at_the_importing_line(monkeypatch):
    monkeypatch.delitem(sys.modules, "anatomy.inference.planning", raising=False)
    with pytest.warns(AnatomyDeprecationWarning) as caught:
        importlib.import_module("anatomy.inference.planning")
    assert caught[0].filename == __file__


def test_an_unknown_module_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("anatomy.no_such_module")


@pytest.mark.parametrize("module, old, new", [
    ("anatomy.inference.generate", "NamedModel", "anatomy.inference.loading.LoadedModel"),
    ("anatomy.inference.generate", "load_named", "anatomy.inference.loading.load_named"),
    ("anatomy.checkpoints.registry", "NamedModel", "anatomy.checkpoints.registry.InstalledModel"),
    ("anatomy.layers.pass_inputs", "Context", "anatomy.layers.pass_inputs.PassInputs"),
    ("anatomy.models.position_rules", "PositionContext", "anatomy.models.position_rules.PositionRules"),
    ("anatomy.models.position_rules", "ContextTables", "anatomy.models.position_rules.PositionTables"),
    ("anatomy.models.position_rules", "build_context", "anatomy.models.position_rules.build_pass_inputs"),
])
def test_old_names_inside_a_module_warn_and_give_the_new_object(module, old, new):
    where, name = new.rsplit(".", 1)
    with pytest.warns(AnatomyDeprecationWarning, match=old):
        got = getattr(importlib.import_module(module), old)
    assert got is getattr(importlib.import_module(where), name)


@torch.no_grad()
def test_a_stacks_old_names_warn_and_give_the_new_ones():
    """Stack.context and Stack.run, renamed so that "context" is a length and "run" a generation."""
    from .inference.conftest import llama_tiny

    stack, ids = llama_tiny().stack, torch.tensor([[1, 2, 3]])
    with pytest.warns(AnatomyDeprecationWarning, match="Stack.context is deprecated; use Stack.position_rules"):
        assert stack.context is stack.position_rules
    ctx, positions = stack.prepare(ids)
    with pytest.warns(AnatomyDeprecationWarning, match="Stack.run is deprecated; use Stack.forward_pass"):
        old = stack.run(ids, ctx, position_ids=positions)
    assert torch.equal(old, stack.forward_pass(ids, ctx, position_ids=positions))


def test_common_runs_warns_and_gives_common_spans():
    from anatomy.weights.gguf import common_runs

    with pytest.warns(AnatomyDeprecationWarning, match="use common_spans"):
        assert common_runs([]) == []
